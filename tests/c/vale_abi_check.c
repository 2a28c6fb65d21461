/*
 * vale_abi_check -- checks vale's port ABI from C, the way a netmap program would use it.
 *
 *   vale_abi_check [-v] [-b] [SWITCH]   (SWITCH defaults to "valec")
 *
 * 1. Checks the size and offset of every field of the ABI structures at run time (vale.h
 *    also checks them at compile time).
 * 2. Opens SWITCH:a and SWITCH:b with the default geometry (valed's run directory comes from
 *    VALE_RUN_DIR), and checks the region header and the netmap_if against each other.
 * 3. Sends N_FRAMES Ethernet frames from a to b with netmap-style ring code only: 60 to
 *    1514 bytes each, plus one 9000-byte frame sent as an NS_MOREFRAG chain.  b checks every
 *    frame's length, every byte and the order.  The learning bridge floods the first frames
 *    (b's address is never learnt, since b sends nothing): with only a and b on the switch,
 *    b receives everything either way.
 *
 * With -b both ports busy-wait (vale_set_busy_wait(p, -1)): every vale_poll() spins instead
 * of sleeping, and the same frames must arrive the same way.
 *
 * Exit 0 after "vale_abi_check: N frames ok"; exit 1 with a message naming the first
 * mismatch, or after 10 s without finishing.
 *
 * Build: cc -std=c11 -Wall -Wextra -Werror -I crates/libvale/include \
 *           tests/c/vale_abi_check.c -L <dir of libvale> -lvale
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <vale.h>

#define N_FRAMES 1000u
#define JUMBO_SEQ 500u      /* this frame is the 9000-byte one */
#define JUMBO_LEN 9000u
#define MIN_LEN 60u
#define MAX_LEN 1514u
#define HDR_LEN 18u         /* Ethernet header + 32-bit sequence number */
#define WINDOW 64u          /* frames sent but not yet received, at most */
#define BURST 32u           /* frames per txsync */
#define TOTAL_MS 10000      /* give up after this long */
#define IDLE_MS 2000        /* longest wait for b to see something */

static const uint8_t MAC_A[6] = {0x02, 0, 0, 0, 0, 0x0a};
static const uint8_t MAC_B[6] = {0x02, 0, 0, 0, 0, 0x0b};
#define ETHERTYPE 0x88b5u   /* IEEE local experimental */

static int verbose;
static int busy;
static int64_t deadline_ns;
static const char *volatile step = "starting";

/* ---- helpers ----------------------------------------------------------------------------- */

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
	va_list ap;
	fputs("vale_abi_check: FAIL: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Milliseconds left before the overall deadline (0 when it has passed), at most cap. */
static int ms_left(int cap)
{
	int64_t left = (deadline_ns - now_ns()) / 1000000;
	if (left <= 0)
		return 0;
	return left < cap ? (int)left : cap;
}

/* A backstop in case a libvale call itself never returns: the loops below honour the
 * deadline on their own and report more precisely. */
static void on_alarm(int sig)
{
	static const char msg[] = "vale_abi_check: FAIL: watchdog: no result after 11 s, stuck in ";
	const char *s = step;
	(void)sig;
	if (write(2, msg, sizeof msg - 1) < 0 || write(2, s, strlen(s)) < 0 || write(2, "\n", 1) < 0) {
	}
	_exit(1);
}

/* ---- 1. layout --------------------------------------------------------------------------- */

static int layout_failures;
static int layout_checks;

static void check_layout(const char *what, size_t got, size_t want)
{
	layout_checks++;
	if (got != want) {
		fprintf(stderr, "vale_abi_check: layout: %s is %zu, expected %zu\n", what, got, want);
		layout_failures++;
	} else if (verbose) {
		printf("  %-44s %5zu ok\n", what, got);
	}
}

#define SIZE(type, want) check_layout("sizeof(" #type ")", sizeof(type), (want))
#define ALIGN(type, want) check_layout("_Alignof(" #type ")", _Alignof(type), (want))
#define OFS(type, field, want) check_layout("offsetof(" #type ", " #field ")", offsetof(type, field), (want))

static void check_all_layouts(void)
{
	SIZE(struct timeval, 16);

	SIZE(struct netmap_slot, 16);
	OFS(struct netmap_slot, buf_idx, 0);
	OFS(struct netmap_slot, len, 4);
	OFS(struct netmap_slot, flags, 6);
	OFS(struct netmap_slot, ptr, 8);

	SIZE(struct netmap_ring, 256);
	ALIGN(struct netmap_ring, 128);
	OFS(struct netmap_ring, buf_ofs, 0);
	OFS(struct netmap_ring, num_slots, 8);
	OFS(struct netmap_ring, nr_buf_size, 12);
	OFS(struct netmap_ring, ringid, 16);
	OFS(struct netmap_ring, dir, 18);
	OFS(struct netmap_ring, head, 20);
	OFS(struct netmap_ring, cur, 24);
	OFS(struct netmap_ring, tail, 28);
	OFS(struct netmap_ring, flags, 32);
	OFS(struct netmap_ring, ts, 40);
	OFS(struct netmap_ring, offset_mask, 56);
	OFS(struct netmap_ring, buf_align, 64);
	OFS(struct netmap_ring, sem, 128);
	OFS(struct netmap_ring, slot, 256);

	SIZE(struct netmap_if, 56);
	OFS(struct netmap_if, ni_name, 0);
	OFS(struct netmap_if, ni_version, 16);
	OFS(struct netmap_if, ni_flags, 20);
	OFS(struct netmap_if, ni_tx_rings, 24);
	OFS(struct netmap_if, ni_rx_rings, 28);
	OFS(struct netmap_if, ni_bufs_head, 32);
	OFS(struct netmap_if, ni_host_tx_rings, 36);
	OFS(struct netmap_if, ni_host_rx_rings, 40);
	OFS(struct netmap_if, ni_spare1, 44);
	OFS(struct netmap_if, ring_ofs, 56);

	SIZE(struct nm_csb_atok, 64);
	ALIGN(struct nm_csb_atok, 64);
	OFS(struct nm_csb_atok, head, 0);
	OFS(struct nm_csb_atok, cur, 4);
	OFS(struct nm_csb_atok, appl_need_kick, 8);
	OFS(struct nm_csb_atok, sync_flags, 12);
	OFS(struct nm_csb_atok, pad, 16);
	SIZE(struct nm_csb_ktoa, 64);
	ALIGN(struct nm_csb_ktoa, 64);
	OFS(struct nm_csb_ktoa, hwcur, 0);
	OFS(struct nm_csb_ktoa, hwtail, 4);
	OFS(struct nm_csb_ktoa, kern_need_kick, 8);
	OFS(struct nm_csb_ktoa, pad, 12);

	SIZE(struct vale_region, 256);
	OFS(struct vale_region, magic, 0);
	OFS(struct vale_region, abi_version, 4);
	OFS(struct vale_region, header_size, 8);
	OFS(struct vale_region, flags, 12);
	OFS(struct vale_region, region_size, 16);
	OFS(struct vale_region, nifp_ofs, 24);
	OFS(struct vale_region, rings_ofs, 32);
	OFS(struct vale_region, csb_ofs, 40);
	OFS(struct vale_region, bufs_ofs, 48);
	OFS(struct vale_region, tx_rings, 56);
	OFS(struct vale_region, rx_rings, 60);
	OFS(struct vale_region, num_slots, 64);
	OFS(struct vale_region, buf_size, 68);
	OFS(struct vale_region, num_bufs, 72);
	OFS(struct vale_region, ring_size, 76);
	OFS(struct vale_region, name, 80);
	OFS(struct vale_region, pad, 144);

	/* The magic reads "VALE" in memory. */
	{
		uint32_t m = VALE_MAGIC;
		check_layout("memcmp(&VALE_MAGIC, \"VALE\", 4) != 0", memcmp(&m, "VALE", 4) != 0, 0);
	}

	if (layout_failures)
		fail("%d of %d layout checks failed", layout_failures, layout_checks);
	printf("vale_abi_check: %d layout checks ok\n", layout_checks);
}

/* ---- 2. open and check a port ------------------------------------------------------------ */

struct port {
	const char *name;
	struct vale_port *p;
	const struct vale_region *reg;
	struct netmap_if *nifp;
	struct netmap_ring *tx;
	struct netmap_ring *rx;
};

static void check_ring(const struct port *pt, const struct netmap_ring *ring, const char *which,
		       uint32_t k, uint16_t dir)
{
	const struct vale_region *r = pt->reg;
	const char *base = (const char *)r;
	const char *want = base + r->rings_ofs + (uint64_t)k * r->ring_size;

	if ((const char *)ring != want)
		fail("%s: %s ring 0 is at region offset %td, the region header says %llu", pt->name,
		     which, (const char *)ring - base,
		     (unsigned long long)(r->rings_ofs + (uint64_t)k * r->ring_size));
	if (ring->num_slots != r->num_slots)
		fail("%s: %s ring has %u slots, the region header says %u", pt->name, which,
		     ring->num_slots, r->num_slots);
	if (ring->nr_buf_size != r->buf_size)
		fail("%s: %s ring has %u-byte buffers, the region header says %u", pt->name, which,
		     ring->nr_buf_size, r->buf_size);
	if (ring->dir != dir)
		fail("%s: %s ring has dir %u, expected %u", pt->name, which, ring->dir, dir);
	if (ring->ringid != 0)
		fail("%s: %s ring 0 has ringid %u", pt->name, which, ring->ringid);
	if (NETMAP_BUF(ring, 0) != base + r->bufs_ofs)
		fail("%s: NETMAP_BUF(%s ring, 0) is at region offset %td, the region header says %llu",
		     pt->name, which, NETMAP_BUF(ring, 0) - base, (unsigned long long)r->bufs_ofs);
	if (ring->head >= ring->num_slots || ring->cur != ring->head || ring->tail >= ring->num_slots)
		fail("%s: %s ring starts with head %u cur %u tail %u (%u slots)", pt->name, which,
		     ring->head, ring->cur, ring->tail, ring->num_slots);
}

static void open_port(struct port *pt, const char *name)
{
	const struct vale_region *r;
	struct netmap_if *nifp;

	pt->name = name;
	step = "vale_open";
	pt->p = vale_open(name, NULL);
	if (!pt->p)
		fail("vale_open(\"%s\"): %s", name, vale_last_error());
	if (busy && vale_set_busy_wait(pt->p, -1) != 0)
		fail("vale_set_busy_wait(%s): %s", name, vale_last_error());
	r = pt->reg = vale_region(pt->p);
	nifp = pt->nifp = vale_nifp(pt->p);
	if (!r || !nifp)
		fail("%s: vale_region or vale_nifp returned NULL", name);

	if (r->magic != VALE_MAGIC)
		fail("%s: region magic is 0x%08x, expected 0x%08x", name, r->magic, VALE_MAGIC);
	if (r->abi_version != VALE_ABI_VERSION)
		fail("%s: region ABI version is %u, expected %u", name, r->abi_version, VALE_ABI_VERSION);
	if (r->header_size != sizeof(struct vale_region))
		fail("%s: region header_size is %u, expected %zu", name, r->header_size,
		     sizeof(struct vale_region));
	if (strncmp(r->name, name, sizeof r->name) != 0)
		fail("%s: region name is \"%.64s\"", name, r->name);
	if ((char *)nifp != (const char *)r + r->nifp_ofs)
		fail("%s: vale_nifp() is at region offset %td, the region header says %llu", name,
		     (char *)nifp - (const char *)r, (unsigned long long)r->nifp_ofs);
	if (nifp->ni_version != NETMAP_API)
		fail("%s: ni_version is %u, expected %u", name, nifp->ni_version, NETMAP_API);
	if (nifp->ni_tx_rings != 1 || nifp->ni_rx_rings != 1)
		fail("%s: netmap_if has %u tx and %u rx rings, expected 1 and 1", name,
		     nifp->ni_tx_rings, nifp->ni_rx_rings);
	if (nifp->ni_host_tx_rings != 0 || nifp->ni_host_rx_rings != 0)
		fail("%s: netmap_if has %u host tx and %u host rx rings, expected none", name,
		     nifp->ni_host_tx_rings, nifp->ni_host_rx_rings);
	if (r->tx_rings != 1 || r->rx_rings != 1)
		fail("%s: region header says %u tx and %u rx rings, expected 1 and 1", name,
		     r->tx_rings, r->rx_rings);
	if (r->num_slots != 1024 || r->buf_size != 2112)
		fail("%s: default geometry is %u slots of %u bytes, expected 1024 of 2112", name,
		     r->num_slots, r->buf_size);
	if (r->num_bufs < VALE_FIRST_BUF + 2 * r->num_slots)
		fail("%s: only %u buffers for 2 rings of %u slots", name, r->num_bufs, r->num_slots);
	if (r->bufs_ofs + (uint64_t)r->num_bufs * r->buf_size > r->region_size)
		fail("%s: buffers end past the region (%llu bytes)", name,
		     (unsigned long long)r->region_size);
	if (r->csb_ofs % 64 != 0 || r->csb_ofs + 2 * VALE_CSB_RING_SIZE > r->bufs_ofs)
		fail("%s: CSB at offset %llu is misplaced", name, (unsigned long long)r->csb_ofs);

	pt->tx = NETMAP_TXRING(nifp, 0);
	pt->rx = NETMAP_RXRING(nifp, 0);
	check_ring(pt, pt->tx, "tx", 0, NR_TX);
	check_ring(pt, pt->rx, "rx", 1, NR_RX);
	if (verbose)
		printf("  %s: region %llu bytes, nifp @%llu, rings @%llu (%u bytes each), csb @%llu, "
		       "%u bufs @%llu\n",
		       name, (unsigned long long)r->region_size, (unsigned long long)r->nifp_ofs,
		       (unsigned long long)r->rings_ofs, r->ring_size, (unsigned long long)r->csb_ofs,
		       r->num_bufs, (unsigned long long)r->bufs_ofs);
}

/* ---- 3. traffic -------------------------------------------------------------------------- */

static uint32_t frame_len(uint32_t seq)
{
	if (seq == JUMBO_SEQ)
		return JUMBO_LEN;
	if (seq == 0)
		return MIN_LEN;
	if (seq == 1)
		return MAX_LEN;
	return MIN_LEN + (seq * 7919u) % (MAX_LEN - MIN_LEN + 1);
}

static uint8_t pattern(uint32_t seq, uint32_t i)
{
	return (uint8_t)(seq * 131u + i * 7u + (i >> 8));
}

static void build_frame(uint8_t *f, uint32_t seq, uint32_t len)
{
	memcpy(f, MAC_B, 6);
	memcpy(f + 6, MAC_A, 6);
	f[12] = (uint8_t)(ETHERTYPE >> 8);
	f[13] = (uint8_t)ETHERTYPE;
	f[14] = (uint8_t)(seq >> 24);
	f[15] = (uint8_t)(seq >> 16);
	f[16] = (uint8_t)(seq >> 8);
	f[17] = (uint8_t)seq;
	for (uint32_t i = HDR_LEN; i < len; i++)
		f[i] = pattern(seq, i);
}

static void check_slot(const struct port *pt, const struct netmap_ring *ring, const char *which,
		       uint32_t i)
{
	const struct netmap_slot *s = &ring->slot[i];
	if (s->buf_idx < VALE_FIRST_BUF || s->buf_idx >= pt->reg->num_bufs)
		fail("%s: %s slot %u holds buffer %u, outside %u..%u", pt->name, which, i, s->buf_idx,
		     VALE_FIRST_BUF, pt->reg->num_bufs - 1);
}

/* Puts one frame on a's tx ring: one slot, or an NS_MOREFRAG chain when it does not fit in
 * one buffer.  Waits (bounded) for room. */
static void send_frame(struct port *a, const uint8_t *frame, uint32_t len, uint32_t seq)
{
	struct netmap_ring *ring = a->tx;
	uint32_t bs = ring->nr_buf_size;
	uint32_t need = (len + bs - 1) / bs;
	uint32_t cur, off;

	while (nm_ring_space(ring) < need) {
		int ms, r;
		step = "vale_txsync (waiting for room)";
		if (vale_txsync(a->p, 0) < 0)
			fail("vale_txsync(%s): %s", a->name, vale_last_error());
		if (nm_ring_space(ring) >= need)
			break;
		ms = ms_left(IDLE_MS);
		if (ms == 0)
			fail("timeout: frame %u needs %u tx slots on %s, %u free after %d ms", seq, need,
			     a->name, nm_ring_space(ring), TOTAL_MS);
		step = "vale_poll(POLLOUT)";
		r = vale_poll(a->p, VALE_POLLOUT, ms);
		if (r < 0)
			fail("vale_poll(%s, POLLOUT): %s", a->name, vale_last_error());
		if (r == 0)
			fail("timeout: %s's tx ring stayed full for %d ms (frame %u, %u of %u slots free)",
			     a->name, ms, seq, nm_ring_space(ring), need);
		if (!(r & VALE_POLLOUT))
			fail("vale_poll(%s, POLLOUT) returned %d", a->name, r);
	}

	cur = ring->cur;
	for (off = 0; off < len;) {
		struct netmap_slot *slot = &ring->slot[cur];
		uint32_t chunk = len - off < bs ? len - off : bs;
		check_slot(a, ring, "tx", cur);
		memcpy(NETMAP_BUF(ring, slot->buf_idx), frame + off, chunk);
		slot->len = (uint16_t)chunk;
		off += chunk;
		slot->flags = off < len ? NS_MOREFRAG : 0;
		cur = nm_ring_next(ring, cur);
	}
	ring->head = ring->cur = cur;
}

struct rx_state {
	uint8_t frame[VALE_MAX_FRAME_LEN];
	uint32_t have;   /* bytes of the frame being reassembled */
	uint32_t frags;  /* its slots so far */
	uint32_t next;   /* sequence number expected next */
	uint8_t want[VALE_MAX_FRAME_LEN];
};

static void check_frame(const struct port *b, struct rx_state *st)
{
	uint32_t seq, len, i;

	if (st->have < HDR_LEN)
		fail("%s: frame %u arrived with %u bytes", b->name, st->next, st->have);
	if (memcmp(st->frame, MAC_B, 6) != 0 || memcmp(st->frame + 6, MAC_A, 6) != 0 ||
	    st->frame[12] != (uint8_t)(ETHERTYPE >> 8) || st->frame[13] != (uint8_t)ETHERTYPE)
		fail("%s: frame %u (%u bytes) has a wrong Ethernet header: "
		     "%02x:%02x:%02x:%02x:%02x:%02x > %02x:%02x:%02x:%02x:%02x:%02x type 0x%02x%02x",
		     b->name, st->next, st->have, st->frame[6], st->frame[7], st->frame[8],
		     st->frame[9], st->frame[10], st->frame[11], st->frame[0], st->frame[1],
		     st->frame[2], st->frame[3], st->frame[4], st->frame[5], st->frame[12],
		     st->frame[13]);
	seq = (uint32_t)st->frame[14] << 24 | (uint32_t)st->frame[15] << 16 |
	      (uint32_t)st->frame[16] << 8 | st->frame[17];
	if (seq >= N_FRAMES)
		fail("%s: received sequence number %u, only 0..%u were sent", b->name, seq, N_FRAMES - 1);
	if (seq == st->next + 1)
		fail("%s: frame %u lost (the next one received is %u)", b->name, st->next, seq);
	if (seq > st->next)
		fail("%s: frames %u..%u lost (the next one received is %u)", b->name, st->next, seq - 1,
		     seq);
	if (seq < st->next)
		fail("%s: frame %u received again or out of order (expected %u)", b->name, seq, st->next);
	len = frame_len(seq);
	if (st->have != len)
		fail("%s: frame %u is %u bytes long (in %u slot(s)), %u were sent", b->name, seq, st->have,
		     st->frags, len);
	build_frame(st->want, seq, len);
	for (i = HDR_LEN; i < len; i++)
		if (st->frame[i] != st->want[i])
			fail("%s: frame %u (%u bytes in %u slot(s)): byte %u is 0x%02x, 0x%02x was sent",
			     b->name, seq, len, st->frags, i, st->frame[i], st->want[i]);
	if (verbose && (seq == JUMBO_SEQ || seq < 2))
		printf("  frame %u: %u bytes in %u slot%s ok\n", seq, len, st->frags,
		       st->frags == 1 ? "" : "s");
	st->next++;
	st->have = 0;
	st->frags = 0;
}

/* Reads b's rx ring from head to tail, then hands all of it back. */
static void drain_rx(struct port *b, struct rx_state *st)
{
	struct netmap_ring *ring = b->rx;
	uint32_t i;

	for (i = ring->head; i != ring->tail; i = nm_ring_next(ring, i)) {
		const struct netmap_slot *s = &ring->slot[i];
		check_slot(b, ring, "rx", i);
		if (s->len > ring->nr_buf_size)
			fail("%s: rx slot %u has len %u, more than the %u-byte buffer", b->name, i, s->len,
			     ring->nr_buf_size);
		if (st->have + s->len > sizeof st->frame)
			fail("%s: frame %u goes on past %zu bytes", b->name, st->next, sizeof st->frame);
		memcpy(st->frame + st->have, NETMAP_BUF(ring, s->buf_idx), s->len);
		st->have += s->len;
		st->frags++;
		if (!(s->flags & NS_MOREFRAG))
			check_frame(b, st);
	}
	ring->head = ring->cur = ring->tail;
	step = "vale_rxsync";
	if (vale_rxsync(b->p, 0) < 0)
		fail("vale_rxsync(%s): %s", b->name, vale_last_error());
}

/* Waits (bounded) for frames on b and takes them. */
static void receive(struct port *b, struct rx_state *st, uint32_t sent)
{
	int ms, r;

	step = "vale_rxsync";
	if (vale_rxsync(b->p, 0) < 0)
		fail("vale_rxsync(%s): %s", b->name, vale_last_error());
	if (nm_ring_empty(b->rx)) {
		ms = ms_left(IDLE_MS);
		if (ms == 0)
			fail("timeout: %s received %u of %u frames in %d ms (%u sent)", b->name, st->next,
			     N_FRAMES, TOTAL_MS, sent);
		step = "vale_poll(POLLIN)";
		r = vale_poll(b->p, VALE_POLLIN, ms);
		if (r < 0)
			fail("vale_poll(%s, POLLIN): %s", b->name, vale_last_error());
		if (r == 0)
			fail("timeout: nothing arrived on %s for %d ms; received %u of %u frames "
			     "(%u sent, %u bytes of frame %u reassembled)",
			     b->name, ms, st->next, N_FRAMES, sent, st->have, st->next);
		if (!(r & VALE_POLLIN))
			fail("vale_poll(%s, POLLIN) returned %d", b->name, r);
		if (nm_ring_empty(b->rx))
			fail("vale_poll(%s, POLLIN) reported frames, but the rx ring is empty "
			     "(head %u cur %u tail %u)",
			     b->name, b->rx->head, b->rx->cur, b->rx->tail);
	}
	drain_rx(b, st);
}

int main(int argc, char **argv)
{
	static uint8_t frame[VALE_MAX_FRAME_LEN];
	static struct rx_state st;
	const char *sw = "valec";
	char name_a[80], name_b[80];
	struct port a, b;
	struct sigaction sa;
	uint32_t sent = 0;
	int r;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-v") == 0)
			verbose = 1;
		else if (strcmp(argv[i], "-b") == 0)
			busy = 1;
		else if (argv[i][0] == '-') {
			fprintf(stderr, "usage: %s [-v] [-b] [SWITCH]\n", argv[0]);
			return 2;
		} else
			sw = argv[i];
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, NULL);
	alarm(TOTAL_MS / 1000 + 1);
	deadline_ns = now_ns() + (int64_t)TOTAL_MS * 1000000;

	check_all_layouts();

	step = "vale_set_busy_wait(NULL)";
	errno = 0;
	if (vale_set_busy_wait(NULL, -1) != -1 || errno != EINVAL)
		fail("vale_set_busy_wait(NULL, -1) did not fail with EINVAL (errno %d)", errno);

	snprintf(name_a, sizeof name_a, "%s:a", sw);
	snprintf(name_b, sizeof name_b, "%s:b", sw);
	memset(&a, 0, sizeof a);
	memset(&b, 0, sizeof b);
	open_port(&a, name_a);
	open_port(&b, name_b);
	printf("vale_abi_check: opened %s and %s (%u slots of %u bytes)%s\n", name_a, name_b,
	       a.reg->num_slots, a.reg->buf_size, busy ? ", busy-waiting" : "");

	/* Keep at most WINDOW frames in flight, so b's rx ring never overflows and nothing is
	 * dropped whatever the two sides' relative speed. */
	while (st.next < N_FRAMES) {
		uint32_t burst = 0;
		while (sent < N_FRAMES && sent - st.next < WINDOW && burst < BURST) {
			uint32_t len = frame_len(sent);
			build_frame(frame, sent, len);
			send_frame(&a, frame, len, sent);
			sent++;
			burst++;
		}
		if (burst) {
			step = "vale_txsync";
			if (vale_txsync(a.p, 0) < 0)
				fail("vale_txsync(%s): %s", a.name, vale_last_error());
		}
		receive(&b, &st, sent);
	}
	if (st.have != 0)
		fail("%s: %u bytes in %u slots after the last frame (NS_MOREFRAG on a last slot?)",
		     b.name, st.have, st.frags);

	/* Nothing more may arrive: no duplicates. */
	step = "vale_poll(POLLIN) for extra frames";
	r = vale_poll(b.p, VALE_POLLIN, ms_left(100));
	if (r < 0)
		fail("vale_poll(%s, POLLIN): %s", b.name, vale_last_error());
	if (r > 0 && !nm_ring_empty(b.rx))
		fail("%s: %u more slots arrived after frame %u, the last one sent", b.name,
		     nm_ring_space(b.rx), N_FRAMES - 1);

	/* Every slot a sent must come back to it: tail reaches head - 1 again. */
	step = "vale_txsync (waiting for tx completion)";
	for (;;) {
		if (vale_txsync(a.p, 0) < 0)
			fail("vale_txsync(%s): %s", a.name, vale_last_error());
		if (nm_ring_space(a.tx) == a.tx->num_slots - 1)
			break;
		if (ms_left(IDLE_MS) == 0)
			fail("timeout: %s's tx ring still has %u slots pending after everything arrived "
			     "(head %u tail %u)",
			     a.name, a.tx->num_slots - 1 - nm_ring_space(a.tx), a.tx->head, a.tx->tail);
		/* POLLOUT would return at once (the ring has room): just look again shortly. */
		{
			struct timespec ts = {0, 1000000};
			nanosleep(&ts, NULL);
		}
	}

	step = "vale_close";
	vale_close(a.p);
	vale_close(b.p);
	alarm(0);
	printf("vale_abi_check: %u frames ok\n", N_FRAMES);
	return 0;
}
