/*
 * net/netmap_user.h -- netmap's user-space helpers (API 14) as vale provides them.
 *
 * The ring macros and inline helpers every netmap program uses, and, when the program
 * defines NETMAP_WITH_LIBS before including this header, the legacy descriptor API
 * (nm_open, nm_close, nm_inject, nm_dispatch, nm_nextpkt).  Like netmap's, this code talks
 * to the control device with open("/dev/netmap"), ioctl() and mmap(): on vale those calls are
 * served by libvale-netmap.so, linked into the program (-lvale-netmap) or preloaded
 * (LD_PRELOAD).  Written for vale from netmap's documented interface; the include guard is
 * netmap's own, so the first of the two headers included wins.
 */
#ifndef _NET_NETMAP_USER_H_
#define _NET_NETMAP_USER_H_

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdio.h>
#include <sys/time.h>
#include "netmap.h"

#define NETMAP_DEVICE_NAME "/dev/netmap"

#ifndef likely
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#endif

/* ------------------------------------------------------------------------------------------ */
/* Finding interfaces, rings and buffers                                                      */
/* ------------------------------------------------------------------------------------------ */

#define _NETMAP_OFFSET(type, ptr, offset) ((type)(void *)((char *)(ptr) + (offset)))

/* The netmap_if at offset ofs of a mapping (nmreq_register.nr_offset). */
#define NETMAP_IF(base, ofs) _NETMAP_OFFSET(struct netmap_if *, base, ofs)

/* Tx ring i of an interface. */
#define NETMAP_TXRING(nifp, i) _NETMAP_OFFSET(struct netmap_ring *, nifp, (nifp)->ring_ofs[i])

/* Rx ring i: its entry follows the tx and host tx entries. */
#define NETMAP_RXRING(nifp, i)                  \
	_NETMAP_OFFSET(struct netmap_ring *, nifp, \
		       (nifp)->ring_ofs[(i) + (nifp)->ni_tx_rings + (nifp)->ni_host_tx_rings])

/* Address of buffer idx, seen from a ring. */
#define NETMAP_BUF(ring, idx) ((char *)(ring) + (ring)->buf_ofs + ((size_t)(idx) * (ring)->nr_buf_size))

/* Index of the buffer at address buf (the inverse of NETMAP_BUF). */
#define NETMAP_BUF_IDX(ring, buf) \
	((uint32_t)(((char *)(buf) - ((char *)(ring) + (ring)->buf_ofs)) / (ring)->nr_buf_size))

/* API 14 buffer offsets: always 0 on vale (the offset option is refused). */
#define NETMAP_ROFFSET(ring, slot) ((slot)->ptr & (ring)->offset_mask)
#define NETMAP_BUF_OFFSET(ring, slot) (NETMAP_BUF(ring, (slot)->buf_idx) + NETMAP_ROFFSET(ring, slot))

/* The slot after slot i. */
static inline uint32_t nm_ring_next(struct netmap_ring *r, uint32_t i)
{
	return unlikely(i + 1 == r->num_slots) ? 0 : i + 1;
}

/* A tx ring still holds slots valed has not sent. */
static inline int nm_tx_pending(struct netmap_ring *r)
{
	return nm_ring_next(r, r->tail) != r->head;
}

/* Slots the client owns, from head to tail: frames to read (rx) or free slots (tx). */
static inline uint32_t nm_ring_space(struct netmap_ring *r)
{
	int n = (int)r->tail - (int)r->head;
	return (uint32_t)(n < 0 ? n + (int)r->num_slots : n);
}

/* Copies l bytes in 64-byte strides (both buffers are 64-byte multiples in netmap and vale);
 * short or odd lengths go through memcpy. */
static inline void nm_pkt_copy(const void *src, void *dst, int l)
{
	if (unlikely(l >= 1024 || l % 64)) {
		memcpy(dst, src, (size_t)l);
		return;
	}
	const uint64_t *s = (const uint64_t *)src;
	uint64_t *d = (uint64_t *)dst;
	for (; l > 0; l -= 64, s += 8, d += 8) {
		d[0] = s[0], d[1] = s[1], d[2] = s[2], d[3] = s[3];
		d[4] = s[4], d[5] = s[5], d[6] = s[6], d[7] = s[7];
	}
}

/*
 * Copies one frame into the first tx ring, of rings first..last taken round robin from *cur,
 * that has room, and moves its head past it; returns size, or 0 if none has room.  What
 * nm_inject() and libnetmap's nmport_inject() share (vale's helper, not netmap API).
 */
static inline int nmv_inject_(struct netmap_if *nifp, uint16_t first, uint16_t last, uint16_t *cur,
			      const void *buf, size_t size)
{
	unsigned int c, n = (unsigned int)(last - first + 1), ri = *cur;

	for (c = 0; c < n; c++, ri++) {
		struct netmap_ring *ring;
		uint32_t i;

		if (ri > last)
			ri = first;
		ring = NETMAP_TXRING(nifp, ri);
		if (nm_ring_empty(ring) || size > ring->nr_buf_size)
			continue;
		i = ring->cur;
		ring->slot[i].len = (uint16_t)size;
		ring->slot[i].flags = 0;
		nm_pkt_copy(buf, NETMAP_BUF(ring, ring->slot[i].buf_idx), (int)size);
		ring->head = ring->cur = nm_ring_next(ring, i);
		*cur = (uint16_t)ri;
		return (int)size;
	}
	return 0;
}

/* Debug printing as netmap programs use it: D() always, RD() at most lps lines a second,
 * ND() never. */
#define ND(fmt, ...) \
	do {             \
	} while (0)
#define D(fmt, ...)                                                                       \
	do {                                                                              \
		struct timeval t_;                                                        \
		gettimeofday(&t_, NULL);                                                  \
		fprintf(stderr, "%03d.%06d %s [%d] " fmt "\n", (int)(t_.tv_sec % 1000),   \
			(int)t_.tv_usec, __func__, __LINE__, ##__VA_ARGS__);              \
	} while (0)
#define RD(lps, fmt, ...)                                            \
	do {                                                         \
		static int rd_count_, rd_sec_;                       \
		struct timeval rd_now_;                              \
		gettimeofday(&rd_now_, NULL);                        \
		if (rd_sec_ != (int)rd_now_.tv_sec) {                \
			rd_sec_ = (int)rd_now_.tv_sec;               \
			rd_count_ = 0;                               \
		}                                                    \
		if (rd_count_++ < (lps))                             \
			D(fmt, ##__VA_ARGS__);                       \
	} while (0)

/* ------------------------------------------------------------------------------------------ */
/* The legacy descriptor API (define NETMAP_WITH_LIBS to get it)                              */
/* ------------------------------------------------------------------------------------------ */

#ifdef NETMAP_WITH_LIBS
#ifndef HAVE_NETMAP_WITH_LIBS
#define HAVE_NETMAP_WITH_LIBS

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/mman.h>

#ifndef u_char
#include <sys/types.h>
#endif

/* What nm_nextpkt() and nm_dispatch() say of a frame; starts as pcap_pkthdr does. */
struct nm_pkthdr {
	struct timeval ts;
	uint32_t caplen;
	uint32_t len;
	uint64_t flags;
#define NM_MORE_PKTS 1
	struct nm_desc *d;
	struct netmap_slot *slot;
	uint8_t *buf;
};

struct nm_stat { /* as pcap_stat */
	unsigned int ps_recv;
	unsigned int ps_drop;
	unsigned int ps_ifdrop;
};

#define NM_ERRBUF_SIZE 512

/* An open port (or some of its rings), as nm_open() returns it. */
struct nm_desc {
	struct nm_desc *self; /* == this descriptor: IS_NETMAP_DESC() */
	int fd;               /* the control descriptor: poll it, ioctl it */
	void *mem;            /* the mapping */
	uint64_t memsize;
	int done_mmap;        /* mem was mapped by this descriptor (else a parent's) */
	struct netmap_if *const nifp;
	uint16_t first_tx_ring, last_tx_ring, cur_tx_ring;
	uint16_t first_rx_ring, last_rx_ring, cur_rx_ring;
	struct nmreq req;     /* the request that bound it; nr_name is the port */
	struct nm_pkthdr hdr;
	struct netmap_ring *const some_ring; /* any ring, to find buffers from */
	void *const buf_start;
	void *const buf_end;
	int snaplen;
	int promisc;
	int to_ms;
	char *errbuf;
	uint32_t if_flags;
	uint32_t if_reqcap;
	uint32_t if_curcap;
	struct nm_stat st;
	char msg[NM_ERRBUF_SIZE];
};

#define P2NMD(p) ((const struct nm_desc *)(p))
#define IS_NETMAP_DESC(d) ((d) && P2NMD(d)->self == P2NMD(d))
#define NETMAP_FD(d) (P2NMD(d)->fd)

typedef void (*nm_cb_t)(unsigned char *, const struct nm_pkthdr *, const unsigned char *);

/* nm_open() flags: the low 16 bits and NETMAP_NO_TX_POLL/NETMAP_DO_RX_POLL are the
 * ring selection; the others say what to take from the `arg` descriptor. */
enum {
	NM_OPEN_NO_MMAP = 0x040000,  /* use arg's mapping (same port) */
	NM_OPEN_IFNAME = 0x080000,   /* take name, ring and flags from req as they are */
	NM_OPEN_ARG1 = 0x100000,
	NM_OPEN_ARG2 = 0x200000,
	NM_OPEN_ARG3 = 0x400000,
	NM_OPEN_RING_CFG = 0x800000, /* take ring counts and sizes from arg */
};

static inline int nm_close(struct nm_desc *d);
static inline int nm_mmap(struct nm_desc *d, const struct nm_desc *parent);

/* Is c allowed in a port name? */
static inline int nm_name_char_(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.' || c == ':';
}

/*
 * Splits "valeX:Y[-N|*|^|{N|}N][/flags]" (or "netmap:ifname...") into d->req: the name,
 * the ring selection (nr_flags NR_REG_*, nr_ringid) and the flags.  Host rings and pipes
 * are parsed so that the control device can refuse them by name.
 */
static inline int nm_parse_(const char *ifname, struct nm_desc *d, char *err)
{
	const char *p = ifname, *name = ifname;
	uint32_t mode = NR_REG_ALL_NIC, ringid = 0, flags = 0;
	size_t n;

	if (strncmp(p, "netmap:", 7) == 0)
		name = p = p + 7;
	else if (strncmp(p, NM_BDG_NAME, 4) != 0) {
		snprintf(err, NM_ERRBUF_SIZE, "'%s': a port name starts with netmap: or vale", ifname);
		return -1;
	}
	while (*p && nm_name_char_(*p))
		p++;
	n = (size_t)(p - name);
	if (n == 0 || n >= sizeof(d->req.nr_name)) {
		snprintf(err, NM_ERRBUF_SIZE, "'%s': the port name is empty or longer than %zu bytes",
			 ifname, sizeof(d->req.nr_name) - 1);
		return -1;
	}
	memcpy(d->req.nr_name, name, n);
	d->req.nr_name[n] = '\0';
	switch (*p) {
	case '-': mode = NR_REG_ONE_NIC; break;
	case '*': mode = NR_REG_NIC_SW; p++; break;
	case '^': mode = NR_REG_SW; p++; break;
	case '{': mode = NR_REG_PIPE_MASTER; break;
	case '}': mode = NR_REG_PIPE_SLAVE; break;
	}
	if (*p == '-' || *p == '{' || *p == '}') {
		char *end;
		unsigned long r = strtoul(p + 1, &end, 10);
		if (end == p + 1 || r > NETMAP_RING_MASK) {
			snprintf(err, NM_ERRBUF_SIZE, "'%s': bad ring number", ifname);
			return -1;
		}
		ringid = (uint32_t)r;
		p = end;
	}
	if (*p == '/') {
		for (p++; *p && *p != '@'; p++) {
			switch (*p) {
			case 'x': flags |= NR_EXCLUSIVE; break;
			case 'z': flags |= NR_ZCOPY_MON; break;
			case 't': flags |= NR_MONITOR_TX; break;
			case 'r': flags |= NR_MONITOR_RX; break;
			case 'R': flags |= NR_RX_RINGS_ONLY; break;
			case 'T': flags |= NR_TX_RINGS_ONLY; break;
			default:
				snprintf(err, NM_ERRBUF_SIZE, "'%s': unknown flag '%c'", ifname, *p);
				return -1;
			}
		}
	}
	if (*p == '@') /* a memory identifier: every vale port has its own memory */
		for (p++; *p >= '0' && *p <= '9'; p++)
			;
	if (*p) {
		snprintf(err, NM_ERRBUF_SIZE, "'%s': unexpected '%s'", ifname, p);
		return -1;
	}
	d->req.nr_flags = mode | flags;
	d->req.nr_ringid = (uint16_t)ringid;
	return 0;
}

/*
 * Opens a port as netmap's nm_open() does: the name is parsed, the descriptor registered
 * (NIOCREGIF) and the memory mapped, unless NM_OPEN_NO_MMAP asks to share arg's mapping.
 * Returns NULL with errno set on failure (the reason goes to stderr).
 */
static inline struct nm_desc *nm_open(const char *ifname, const struct nmreq *req, uint64_t new_flags,
				      const struct nm_desc *arg)
{
	struct nm_desc *d = (struct nm_desc *)calloc(1, sizeof(*d));
	const struct nm_desc *parent = arg;
	uint32_t mode;
	int saved;

	if (d == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	d->self = d;
	d->fd = -1;
	if (!(new_flags & NM_OPEN_IFNAME) && nm_parse_(ifname, d, d->msg) < 0) {
		errno = EINVAL;
		goto fail;
	}
	if (new_flags & NM_OPEN_IFNAME) {
		if (req == NULL) {
			snprintf(d->msg, sizeof(d->msg), "NM_OPEN_IFNAME needs a request");
			errno = EINVAL;
			goto fail;
		}
		memcpy(d->req.nr_name, req->nr_name, sizeof(d->req.nr_name));
		d->req.nr_ringid = req->nr_ringid;
		d->req.nr_flags = req->nr_flags;
	}
	if (req && (new_flags & NM_OPEN_RING_CFG)) {
		d->req.nr_tx_slots = req->nr_tx_slots;
		d->req.nr_rx_slots = req->nr_rx_slots;
		d->req.nr_tx_rings = req->nr_tx_rings;
		d->req.nr_rx_rings = req->nr_rx_rings;
	}
	if (parent && (new_flags & NM_OPEN_RING_CFG) && req == NULL) {
		d->req.nr_tx_slots = parent->req.nr_tx_slots;
		d->req.nr_rx_slots = parent->req.nr_rx_slots;
		d->req.nr_tx_rings = parent->req.nr_tx_rings;
		d->req.nr_rx_rings = parent->req.nr_rx_rings;
	}
	if (req && (new_flags & NM_OPEN_ARG1))
		d->req.nr_arg1 = req->nr_arg1;
	if (req && (new_flags & NM_OPEN_ARG3))
		d->req.nr_arg3 = req->nr_arg3;
	/* NETMAP_NO_TX_POLL / NETMAP_DO_RX_POLL may come in the flags, as in netmap */
	d->req.nr_ringid |= (uint16_t)(new_flags & (NETMAP_NO_TX_POLL | NETMAP_DO_RX_POLL));
	d->req.nr_version = NETMAP_API;

	d->fd = open(NETMAP_DEVICE_NAME, O_RDWR);
	if (d->fd < 0) {
		snprintf(d->msg, sizeof(d->msg), "cannot open %s: %s", NETMAP_DEVICE_NAME, strerror(errno));
		goto fail;
	}
	if (ioctl(d->fd, NIOCREGIF, &d->req) < 0) {
		snprintf(d->msg, sizeof(d->msg), "NIOCREGIF %s: %s", d->req.nr_name, strerror(errno));
		goto fail;
	}
	if ((!(new_flags & NM_OPEN_NO_MMAP) || parent) && nm_mmap(d, parent) < 0) {
		snprintf(d->msg, sizeof(d->msg), "mmap %s: %s", d->req.nr_name, strerror(errno));
		goto fail;
	}
	mode = d->req.nr_flags & NR_REG_MASK;
	if (mode == NR_REG_ONE_NIC) {
		d->first_tx_ring = d->last_tx_ring = d->req.nr_ringid & NETMAP_RING_MASK;
		d->first_rx_ring = d->last_rx_ring = d->req.nr_ringid & NETMAP_RING_MASK;
	} else {
		d->first_tx_ring = d->first_rx_ring = 0;
		d->last_tx_ring = d->req.nr_tx_rings - 1;
		d->last_rx_ring = d->req.nr_rx_rings - 1;
	}
	d->cur_tx_ring = d->first_tx_ring;
	d->cur_rx_ring = d->first_rx_ring;
	return d;
fail:
	saved = errno ? errno : EINVAL;
	fprintf(stderr, "nm_open %s: %s\n", ifname ? ifname : "(null)", d->msg);
	nm_close(d);
	errno = saved;
	return NULL;
}

/* Maps the port's memory, or shares the parent's when it is the same memory. */
static inline int nm_mmap(struct nm_desc *d, const struct nm_desc *parent)
{
	if (d->done_mmap)
		return 0;
	if (parent && parent->mem && parent->req.nr_arg2 == d->req.nr_arg2) {
		d->mem = parent->mem;
		d->memsize = parent->memsize;
	} else {
		void *m = mmap(0, d->req.nr_memsize, PROT_WRITE | PROT_READ, MAP_SHARED, d->fd, 0);
		if (m == MAP_FAILED)
			return -1;
		d->mem = m;
		d->memsize = d->req.nr_memsize;
		d->done_mmap = 1;
	}
	{
		struct netmap_if *nifp = NETMAP_IF(d->mem, d->req.nr_offset);
		struct netmap_ring *r = NETMAP_TXRING(nifp, 0);
		*(struct netmap_if **)(uintptr_t)&d->nifp = nifp;
		*(struct netmap_ring **)(uintptr_t)&d->some_ring = r;
		*(void **)(uintptr_t)&d->buf_start = NETMAP_BUF(r, 0);
		*(void **)(uintptr_t)&d->buf_end = (char *)d->mem + d->memsize;
	}
	return 0;
}

/* Unmaps (if this descriptor mapped), closes and frees. */
static inline int nm_close(struct nm_desc *d)
{
	if (d == NULL || d->self != d)
		return EINVAL;
	if (d->done_mmap && d->mem)
		munmap(d->mem, d->memsize);
	if (d->fd >= 0)
		close(d->fd);
	memset((void *)d, 0, sizeof(*d));
	free(d);
	return 0;
}

/* Copies one frame into the first bound tx ring with room; returns size, or 0 if none has
 * room.  The frame goes out at the next sync (NIOCTXSYNC or poll). */
static inline int nm_inject(struct nm_desc *d, const void *buf, size_t size)
{
	return nmv_inject_(d->nifp, d->first_tx_ring, d->last_tx_ring, &d->cur_tx_ring, buf, size);
}

/* Calls cb for up to cnt received frames (all of them if cnt <= 0); returns how many. */
static inline int nm_dispatch(struct nm_desc *d, int cnt, nm_cb_t cb, unsigned char *arg)
{
	int n = d->last_rx_ring - d->first_rx_ring + 1;
	int c, got = 0, ri = d->cur_rx_ring;

	if (cnt == 0)
		cnt = -1;
	for (c = 0; c < n && cnt != got; c++, ri++) {
		struct netmap_ring *ring;

		if (ri > d->last_rx_ring)
			ri = d->first_rx_ring;
		ring = NETMAP_RXRING(d->nifp, ri);
		for (; !nm_ring_empty(ring) && cnt != got; got++) {
			uint32_t i = ring->cur;
			struct netmap_slot *slot = &ring->slot[i];
			unsigned char *buf = (unsigned char *)NETMAP_BUF(ring, slot->buf_idx);

			d->hdr.len = d->hdr.caplen = slot->len;
			d->hdr.ts = ring->ts;
			d->hdr.slot = slot;
			d->hdr.buf = buf;
			d->hdr.d = d;
			cb(arg, &d->hdr, buf);
			ring->head = ring->cur = nm_ring_next(ring, i);
		}
	}
	d->cur_rx_ring = (uint16_t)ri;
	return got;
}

/* The next received frame (hdr filled in), or NULL if no bound rx ring holds one. */
static inline unsigned char *nm_nextpkt(struct nm_desc *d, struct nm_pkthdr *hdr)
{
	int ri = d->cur_rx_ring;

	do {
		struct netmap_ring *ring = NETMAP_RXRING(d->nifp, ri);
		if (!nm_ring_empty(ring)) {
			uint32_t i = ring->cur;
			struct netmap_slot *slot = &ring->slot[i];
			unsigned char *buf = (unsigned char *)NETMAP_BUF(ring, slot->buf_idx);

			hdr->ts = ring->ts;
			hdr->len = hdr->caplen = slot->len;
			hdr->flags = 0;
			hdr->slot = slot;
			hdr->buf = buf;
			hdr->d = d;
			ring->head = ring->cur = nm_ring_next(ring, i);
			d->cur_rx_ring = (uint16_t)ri;
			return buf;
		}
		ri++;
		if (ri > d->last_rx_ring)
			ri = d->first_rx_ring;
	} while (ri != d->cur_rx_ring);
	return NULL;
}

#endif /* HAVE_NETMAP_WITH_LIBS */
#endif /* NETMAP_WITH_LIBS */

#endif /* _NET_NETMAP_USER_H_ */
