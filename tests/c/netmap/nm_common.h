/*
 * What the netmap test programs share: the test frame (a sequence number and a pattern that
 * depends on it, so a receiver can check every byte) and small helpers.  Written against
 * netmap's standard API only.
 */
#ifndef NM_COMMON_H
#define NM_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ETH_TEST_TYPE 0x88b5 /* IEEE local experimental */
#define HDR_LEN 22           /* 14 Ethernet + 4 sequence + 4 ring tag */

static inline double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Frame `seq` of `len` bytes, sent on tx ring `ring`. */
static inline void fill_frame(unsigned char *f, uint32_t seq, uint32_t ring, unsigned len)
{
	static const unsigned char hdr[14] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0,
					      1,    ETH_TEST_TYPE >> 8, ETH_TEST_TYPE & 0xff};
	memcpy(f, hdr, 14);
	memcpy(f + 14, &seq, 4);
	memcpy(f + 18, &ring, 4);
	for (unsigned i = HDR_LEN; i < len; i++)
		f[i] = (unsigned char)(seq * 7 + i);
}

/* Checks a received frame byte by byte; returns its sequence number and ring tag, or -1. */
static inline int check_frame(const unsigned char *f, unsigned len, unsigned want_len, uint32_t *seq,
			      uint32_t *ring)
{
	unsigned char ref[2048];
	if (len != want_len || len > sizeof(ref) || len < HDR_LEN)
		return -1;
	memcpy(seq, f + 14, 4);
	memcpy(ring, f + 18, 4);
	fill_frame(ref, *seq, *ring, len);
	return memcmp(ref, f, len) == 0 ? 0 : -1;
}

#ifdef NETMAP_API
/* A register request for port `name`, all rings, as NIOCCTRL takes it: `h` points at `reg`. */
static inline void register_request(struct nmreq_header *h, struct nmreq_register *reg, const char *name)
{
	memset(h, 0, sizeof(*h));
	memset(reg, 0, sizeof(*reg));
	h->nr_version = NETMAP_API;
	h->nr_reqtype = NETMAP_REQ_REGISTER;
	snprintf(h->nr_name, sizeof(h->nr_name), "%s", name);
	h->nr_body = (uintptr_t)reg;
	reg->nr_mode = NR_REG_ALL_NIC;
}
#endif

#endif
