/*
 * vale.h -- the C interface of libvale, the client library of the vale software switch.
 *
 * A process opens a port "valeX:Y" with vale_open() and gets one shared memory region that
 * holds the port's rings, slots and packet buffers.  The rings, slots and the interface
 * descriptor have the binary layout of netmap's (API 14), so code written against netmap's
 * rings runs unchanged: only the open and sync calls differ (vale_open instead of
 * open("/dev/netmap") + NIOCREGIF, vale_txsync/vale_rxsync instead of the NIOCTXSYNC and
 * NIOCRXSYNC ioctls, vale_poll instead of poll() on the netmap fd).
 *
 * The structures are written here from the layout alone; docs/abi.md in the vale source tree
 * is the full description of the port ABI (who writes which field, the notification
 * protocol, what valed checks).  The Rust crate vale-abi holds the same facts; both must
 * change together, and together with VALE_ABI_VERSION.
 *
 * Include order: if a program also uses netmap's own headers, include them before this one.
 * The netmap structures below are then taken from netmap's header (they are the same bytes;
 * the size and offset checks at the end of this file confirm it).
 *
 * vale targets 64-bit Linux; the checks below refuse to compile anywhere the layout would
 * differ (for instance where struct timeval is not 16 bytes).
 */
#ifndef VALE_H
#define VALE_H

#include <stdint.h>
#include <stddef.h>
#include <sys/time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VALE_ALIGNED(n) __attribute__((__aligned__(n)))

/* Flexible array members are an extension in C++; say so, so -pedantic stays quiet. */
#ifdef __cplusplus
#define VALE_FLEX __extension__
#else
#define VALE_FLEX
#endif

#ifdef __cplusplus
#define VALE_STATIC_ASSERT(expr, msg) static_assert(expr, msg)
#define VALE_ALIGNOF(type) alignof(type)
#else
#define VALE_STATIC_ASSERT(expr, msg) _Static_assert(expr, msg)
#define VALE_ALIGNOF(type) _Alignof(type)
#endif

/* ------------------------------------------------------------------------------------------ */
/* netmap's structures (API 14)                                                               */
/* ------------------------------------------------------------------------------------------ */

/*
 * The structures (netmap_if, netmap_ring, netmap_slot, the CSB) and the ring helpers
 * (NETMAP_TXRING, NETMAP_BUF, nm_ring_next, nm_ring_space...) come from vale's own netmap
 * headers, installed next to this one.  Both use netmap's include guards: when a program
 * has included netmap's headers already, theirs are used, and the layout checks below
 * confirm that they are the same bytes.
 */
#include "vale-netmap/net/netmap.h"
#include "vale-netmap/net/netmap_user.h"

#if NETMAP_API < 14
#error "vale.h: the netmap header included before vale.h is older than API 14; its ring layout differs"
#endif

/* ------------------------------------------------------------------------------------------ */
/* The vale region                                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * Every port has one region (a sealed memfd mapped by valed and by the port's one client),
 * laid out as follows; every offset is from the start of the region:
 *
 *   0           struct vale_region (256 bytes): magic, ABI version, geometry, offsets
 *   nifp_ofs    struct netmap_if, then ring_ofs[] (offsets from the netmap_if):
 *               tx rings, then rx rings
 *   rings_ofs   the rings in region order: tx ring 0 .. tx_rings-1, then rx ring 0 ..
 *               rx_rings-1, each ring_size bytes (256-byte header + num_slots slots,
 *               rounded up to 256); ring_ofs[k] == rings_ofs + k * ring_size - nifp_ofs
 *   csb_ofs     one 128-byte CSB pair per ring, in the same order: nm_csb_atok at
 *               csb_ofs + k * 128, nm_csb_ktoa at csb_ofs + k * 128 + 64
 *               (page aligned)
 *   bufs_ofs    buffers 0 .. num_bufs-1, buf_size bytes each (page aligned); buffers 0 and
 *               1 are reserved, every slot's buffer index is in 2 .. num_bufs-1
 *   region_size end of the region (page aligned)
 *
 * "Region order" index k of a ring: tx ring t is k = t, rx ring r is k = tx_rings + r.
 * Each ring's buf_ofs is bufs_ofs minus the ring's own offset, so NETMAP_BUF(ring, i) is
 * region + bufs_ofs + i * buf_size from any ring.
 *
 * libvale checks magic, abi_version and every offset against its own computation of the
 * layout before vale_open() returns; a program may read the header but never writes it.
 */
struct vale_region {
	uint32_t magic;       /* VALE_MAGIC */
	uint32_t abi_version; /* VALE_ABI_VERSION */
	uint32_t header_size; /* sizeof(struct vale_region), 256 */
	uint32_t flags;       /* 0 */
	uint64_t region_size; /* bytes mapped */
	uint64_t nifp_ofs;    /* struct netmap_if */
	uint64_t rings_ofs;   /* first ring */
	uint64_t csb_ofs;     /* first CSB pair */
	uint64_t bufs_ofs;    /* buffer 0 */
	uint32_t tx_rings;
	uint32_t rx_rings;
	uint32_t num_slots;   /* slots per ring */
	uint32_t buf_size;    /* bytes per buffer */
	uint32_t num_bufs;    /* buffers in the region, including the reserved 0 and 1 */
	uint32_t ring_size;   /* bytes from one ring to the next */
	char name[64];        /* "valeX:Y", NUL-terminated */
	uint8_t pad[112];
};

/* "VALE" as the four bytes of the magic field in memory (a little-endian u32). */
#define VALE_MAGIC 0x454c4156u
/* Bumped on every incompatible change of the region or of the control protocol. */
#define VALE_ABI_VERSION 2

#define VALE_REGION_HEADER_SIZE 256
#define VALE_CSB_RING_SIZE 128 /* bytes of CSB per ring: atok, then ktoa */
#define VALE_FIRST_BUF 2       /* lowest buffer index a slot may hold */

/* Port geometry limits (vale_open_opts); valed refuses anything outside them. */
#define VALE_MAX_RINGS 16          /* per direction */
#define VALE_MIN_SLOTS 64          /* slots per ring: a power of two in [64, 4096] */
#define VALE_MAX_SLOTS 4096
#define VALE_MIN_BUF_SIZE 128      /* buffer size: a multiple of 64 in [128, 16384] */
#define VALE_MAX_BUF_SIZE 16384
#define VALE_BUF_ALIGN 64
#define VALE_MAX_REGION_SIZE (1ull << 30)
#define VALE_MAX_FRAME_LEN 65536   /* all slots of one NS_MOREFRAG chain together */
#define VALE_MAX_FRAGS 512         /* slots of one NS_MOREFRAG chain */

#define VALE_DEFAULT_RUN_DIR "/run/vale" /* when opts->run_dir and VALE_RUN_DIR are unset */
#define VALE_SOCKET_NAME "valed.sock"    /* valed's control socket inside the run directory */

/* The CSB halves of the ring with region-order index k (see above). */
#define VALE_CSB_ATOK(region, k)                                       \
	((struct nm_csb_atok *)((char *)(region) + (region)->csb_ofs + \
				(size_t)(k) * VALE_CSB_RING_SIZE))
#define VALE_CSB_KTOA(region, k)                                       \
	((struct nm_csb_ktoa *)((char *)(region) + (region)->csb_ofs + \
				(size_t)(k) * VALE_CSB_RING_SIZE + 64))

/* ------------------------------------------------------------------------------------------ */
/* Layout checks                                                                              */
/* ------------------------------------------------------------------------------------------ */

VALE_STATIC_ASSERT(sizeof(struct timeval) == 16, "vale needs a 16-byte struct timeval (64-bit Linux)");

VALE_STATIC_ASSERT(sizeof(struct netmap_slot) == 16, "netmap_slot size");
VALE_STATIC_ASSERT(offsetof(struct netmap_slot, buf_idx) == 0, "netmap_slot.buf_idx");
VALE_STATIC_ASSERT(offsetof(struct netmap_slot, len) == 4, "netmap_slot.len");
VALE_STATIC_ASSERT(offsetof(struct netmap_slot, flags) == 6, "netmap_slot.flags");
VALE_STATIC_ASSERT(offsetof(struct netmap_slot, ptr) == 8, "netmap_slot.ptr");

VALE_STATIC_ASSERT(sizeof(struct netmap_ring) == 256, "netmap_ring header size");
VALE_STATIC_ASSERT(VALE_ALIGNOF(struct netmap_ring) == 128, "netmap_ring alignment");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, buf_ofs) == 0, "netmap_ring.buf_ofs");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, num_slots) == 8, "netmap_ring.num_slots");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, nr_buf_size) == 12, "netmap_ring.nr_buf_size");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, ringid) == 16, "netmap_ring.ringid");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, dir) == 18, "netmap_ring.dir");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, head) == 20, "netmap_ring.head");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, cur) == 24, "netmap_ring.cur");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, tail) == 28, "netmap_ring.tail");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, flags) == 32, "netmap_ring.flags");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, ts) == 40, "netmap_ring.ts");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, offset_mask) == 56, "netmap_ring.offset_mask");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, buf_align) == 64, "netmap_ring.buf_align");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, sem) == 128, "netmap_ring.sem");
VALE_STATIC_ASSERT(offsetof(struct netmap_ring, slot) == 256, "netmap_ring.slot");

VALE_STATIC_ASSERT(sizeof(struct netmap_if) == 56, "netmap_if header size");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ni_name) == 0, "netmap_if.ni_name");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ni_version) == 16, "netmap_if.ni_version");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ni_flags) == 20, "netmap_if.ni_flags");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ni_tx_rings) == 24, "netmap_if.ni_tx_rings");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ni_rx_rings) == 28, "netmap_if.ni_rx_rings");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ni_bufs_head) == 32, "netmap_if.ni_bufs_head");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ni_host_tx_rings) == 36, "netmap_if.ni_host_tx_rings");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ni_host_rx_rings) == 40, "netmap_if.ni_host_rx_rings");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ni_spare1) == 44, "netmap_if.ni_spare1");
VALE_STATIC_ASSERT(offsetof(struct netmap_if, ring_ofs) == 56, "netmap_if.ring_ofs");
VALE_STATIC_ASSERT(sizeof(((struct netmap_if *)0)->ring_ofs[0]) == 8, "netmap_if.ring_ofs entry size");

VALE_STATIC_ASSERT(sizeof(struct nm_csb_atok) == 64, "nm_csb_atok size");
VALE_STATIC_ASSERT(offsetof(struct nm_csb_atok, head) == 0, "nm_csb_atok.head");
VALE_STATIC_ASSERT(offsetof(struct nm_csb_atok, cur) == 4, "nm_csb_atok.cur");
VALE_STATIC_ASSERT(offsetof(struct nm_csb_atok, appl_need_kick) == 8, "nm_csb_atok.appl_need_kick");
VALE_STATIC_ASSERT(offsetof(struct nm_csb_atok, sync_flags) == 12, "nm_csb_atok.sync_flags");
VALE_STATIC_ASSERT(sizeof(struct nm_csb_ktoa) == 64, "nm_csb_ktoa size");
VALE_STATIC_ASSERT(offsetof(struct nm_csb_ktoa, hwcur) == 0, "nm_csb_ktoa.hwcur");
VALE_STATIC_ASSERT(offsetof(struct nm_csb_ktoa, hwtail) == 4, "nm_csb_ktoa.hwtail");
VALE_STATIC_ASSERT(offsetof(struct nm_csb_ktoa, kern_need_kick) == 8, "nm_csb_ktoa.kern_need_kick");
VALE_STATIC_ASSERT(2 * 64 == VALE_CSB_RING_SIZE, "CSB pair size");

VALE_STATIC_ASSERT(sizeof(struct vale_region) == VALE_REGION_HEADER_SIZE, "vale_region size");
VALE_STATIC_ASSERT(offsetof(struct vale_region, magic) == 0, "vale_region.magic");
VALE_STATIC_ASSERT(offsetof(struct vale_region, abi_version) == 4, "vale_region.abi_version");
VALE_STATIC_ASSERT(offsetof(struct vale_region, header_size) == 8, "vale_region.header_size");
VALE_STATIC_ASSERT(offsetof(struct vale_region, flags) == 12, "vale_region.flags");
VALE_STATIC_ASSERT(offsetof(struct vale_region, region_size) == 16, "vale_region.region_size");
VALE_STATIC_ASSERT(offsetof(struct vale_region, nifp_ofs) == 24, "vale_region.nifp_ofs");
VALE_STATIC_ASSERT(offsetof(struct vale_region, rings_ofs) == 32, "vale_region.rings_ofs");
VALE_STATIC_ASSERT(offsetof(struct vale_region, csb_ofs) == 40, "vale_region.csb_ofs");
VALE_STATIC_ASSERT(offsetof(struct vale_region, bufs_ofs) == 48, "vale_region.bufs_ofs");
VALE_STATIC_ASSERT(offsetof(struct vale_region, tx_rings) == 56, "vale_region.tx_rings");
VALE_STATIC_ASSERT(offsetof(struct vale_region, rx_rings) == 60, "vale_region.rx_rings");
VALE_STATIC_ASSERT(offsetof(struct vale_region, num_slots) == 64, "vale_region.num_slots");
VALE_STATIC_ASSERT(offsetof(struct vale_region, buf_size) == 68, "vale_region.buf_size");
VALE_STATIC_ASSERT(offsetof(struct vale_region, num_bufs) == 72, "vale_region.num_bufs");
VALE_STATIC_ASSERT(offsetof(struct vale_region, ring_size) == 76, "vale_region.ring_size");
VALE_STATIC_ASSERT(offsetof(struct vale_region, name) == 80, "vale_region.name");
VALE_STATIC_ASSERT(offsetof(struct vale_region, pad) == 144, "vale_region.pad");

/* ------------------------------------------------------------------------------------------ */
/* The libvale API                                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * Threads: a ring is driven by one thread at a time (the thread that fills or drains it
 * calls its sync); different rings of a port may be driven by different threads at once.
 * vale_poll() and vale_arm() look at and sync every ring of the port, so they belong to the
 * thread that drives all of them; a thread that drives one ring waits with vale_poll_ring().
 * vale_open/vale_close may be called from any thread; vale_close must not race with any other
 * call on the same port.
 *
 * Errors: a call that fails returns NULL or -1, sets errno and leaves a message for
 * vale_last_error().  A refusal of valed's sets the errno of its kind: ENOENT (no such
 * switch or port), EBUSY (in use), EACCES (another user's port, or an administrator's
 * operation), ENOSPC (a per-user or per-switch limit), EINVAL (a bad name or value),
 * EOPNOTSUPP, ENODEV (gone meanwhile), EIO (valed could not do it); ECONNRESET when valed
 * went away.
 *
 * valed going away: the port lives as long as its control connection to valed.  When valed
 * exits or dies, vale_poll() returns -1 at once (even with no timeout), and vale_txsync() and
 * vale_rxsync() return -1 within about a millisecond of calls that find nothing new; errno
 * is then ECONNRESET, and every later call on the port fails the same way.  The only thing
 * left to do with the port is vale_close().
 */

/* An open port (opaque): the control connection, the mapped region and the notification
 * descriptors (a kick eventfd and an interrupt pipe per ring). */
struct vale_port;

/* Port geometry and where to find valed.  Always start from vale_open_opts_init(). */
struct vale_open_opts {
	uint32_t tx_rings;   /* 1 .. VALE_MAX_RINGS */
	uint32_t rx_rings;   /* 1 .. VALE_MAX_RINGS */
	uint32_t slots;      /* slots per ring: a power of two, VALE_MIN_SLOTS .. VALE_MAX_SLOTS */
	uint32_t buf_size;   /* bytes per buffer: multiple of 64, VALE_MIN_BUF_SIZE .. VALE_MAX_BUF_SIZE */
	const char *run_dir; /* valed's run directory; NULL: $VALE_RUN_DIR, else VALE_DEFAULT_RUN_DIR */
	int no_autostart;    /* nonzero: fail when no valed answers, instead of starting one
	                      * (default: 0, or 1 when VALE_NO_AUTOSTART is set and not "0") */
};

/* Fills *o with the defaults: 1 tx ring, 1 rx ring, 1024 slots, 2112-byte buffers,
 * run_dir NULL, no_autostart 0 (unless VALE_NO_AUTOSTART says otherwise). */
void vale_open_opts_init(struct vale_open_opts *o);

/*
 * Opens port `name` ("valeX:Y"; the switch and the port are created if they do not exist)
 * and makes the calling process its owner until vale_close() or exit.  opts may be NULL for
 * the defaults.  Returns NULL on error (no such daemon, bad name or geometry, port in use,
 * ABI version mismatch...): see vale_last_error().
 */
struct vale_port *vale_open(const char *name, const struct vale_open_opts *opts);

/* Unmaps the region, closes every descriptor and gives the port back to valed (which frees
 * it unless it is persistent), returning once valed has.  After a fork() since the open, the
 * port may be another process's too: the call then closes this process's descriptors only
 * and returns at once, and valed frees the port when the last process holding it closes it
 * or exits.  NULL is accepted and ignored. */
void vale_close(struct vale_port *p);

/* The port's netmap_if: find the rings with NETMAP_TXRING / NETMAP_RXRING.  Valid until
 * vale_close(). */
struct netmap_if *vale_nifp(const struct vale_port *p);

/* The port's region header (read only), for its geometry and the CSB.  Valid until
 * vale_close(). */
const struct vale_region *vale_region(const struct vale_port *p);

/*
 * Publishes ring->head and ring->cur of tx ring `ring` to valed (slots before head are
 * handed over for sending) and refreshes ring->tail with the slots valed has finished with.
 * No system call is made unless valed has asked to be kicked (it sleeps on that ring), or,
 * at most once a millisecond, to see whether valed is still there when nothing moved.
 * Returns 0, or -1 if `ring` is not a tx ring of the port or head/cur lie outside the ring
 * (nothing is published then, errno EIO), or if valed has gone away (errno ECONNRESET).
 */
int vale_txsync(struct vale_port *p, uint32_t ring);

/*
 * The same for rx ring `ring`: publishes ring->head/cur (slots before head are given back
 * to valed for new frames) and refreshes ring->tail with the frames that arrived.  valed
 * does not need a kick on rx rings: no system call but the millisecond look at valed when
 * nothing arrived.  Returns 0 or -1 as vale_txsync().
 */
int vale_rxsync(struct vale_port *p, uint32_t ring);

#define VALE_POLLIN 1  /* some rx ring has frames between cur and tail */
#define VALE_POLLOUT 2 /* some tx ring has free slots between cur and tail */

/*
 * Waits until one of `events` holds on some ring of the port, or timeout_ms milliseconds
 * pass (< 0: no limit; 0: only look).  Returns the mask of events that hold (a subset of
 * `events`), 0 on timeout, -1 on error (errno ECONNRESET: valed went away; the wait watches
 * the control connection too).  The rings behind a reported event are synced (their tail is
 * fresh) on return.  The wait is on the rings' interrupt lines, with notification enabled
 * only while sleeping, so an idle client costs valed nothing.
 */
int vale_poll(struct vale_port *p, int events, int timeout_ms);

/*
 * vale_poll() on one ring: waits on rx ring `ring` (VALE_POLLIN) and/or tx ring `ring`
 * (VALE_POLLOUT) only, syncing those and no others, so that threads that each drive a ring
 * can each wait on their own at the same time.  Returns as vale_poll(); -1 with errno EIO if
 * the port has no such ring.
 */
int vale_poll_ring(struct vale_port *p, uint32_t ring, int events, int timeout_ms);

/*
 * A pollable descriptor for the port, for a program's own event loop (poll, select, epoll,
 * next to its other descriptors): it becomes readable when a ring armed by vale_arm() may be
 * ready, or when valed went away.  Owned by the port (do not close it); valid until
 * vale_close().  Returns -1 on error.
 *
 * The loop is netmap's, with the arming made explicit:
 *
 *     for (;;) {
 *         int ready = vale_arm(p, VALE_POLLIN);   // syncs; > 0: something is ready already
 *         if (ready == 0)
 *             poll(&(struct pollfd){.fd = vale_fd(p), .events = POLLIN}, 1, -1);
 *         ... read the rx rings, vale_rxsync() ...
 *     }
 *
 * valed raises a ring's interrupt only after vale_arm() asked for it, and a sync of the ring
 * withdraws the request, so a busy client costs valed no system call.
 */
int vale_fd(struct vale_port *p);

/*
 * Gets the port ready for a sleep on vale_fd(): consumes the interrupts that woke it, syncs
 * every tx ring (queued slots go out) and, for VALE_POLLIN, every rx ring, and returns the
 * events that already hold (> 0: do not sleep).  If none does, it asks valed for interrupts
 * on the rings `events` concerns and returns 0: a sleep on vale_fd() then wakes up for any
 * frame (or room) that comes after.  -1 on error (errno ECONNRESET: valed went away).
 */
int vale_arm(struct vale_port *p, int events);

/*
 * Chooses how vale_poll() waits on this port from now on:
 *   spin_us == 0  sleep in poll(2) on the interrupt lines (the default): an idle client costs
 *                 no CPU, each wake-up a system call and a trip through the scheduler;
 *   spin_us <  0  busy-wait, never sleep: vale_poll() spins (with a CPU pause between looks)
 *                 on the hwtail valed writes in the CSB, and never sets appl_need_kick, so
 *                 valed never raises the interrupt line either.  No system call while
 *                 waiting but, at most once a millisecond, a zero-timeout look at the control
 *                 connection: a valed that went away still ends the wait (errno ECONNRESET).
 *                 timeout_ms still bounds the spin (< 0: spin until something happens);
 *   spin_us >  0  spin up to spin_us microseconds per call, then sleep as with 0.
 * Busy waiting burns a whole CPU for as long as the wait lasts: give each busy client a
 * core of its own.  On a CPU that other tasks want, the spin gives way: it yields the CPU
 * between looks (sched_yield), and while others keep the CPU it sleeps as with 0 instead,
 * for a while (then it may set appl_need_kick and consume interrupts).  It changes nothing else: vale_txsync() still kicks valed when valed
 * sleeps on the ring and asked for a kick, so a busy client works with any valed; only
 * with valed busy-polling too (valed --busy-poll-us) is there no kick and no interrupt per
 * packet.  vale_txsync()/vale_rxsync() never wait, in either mode.  Returns 0, or -1 if p
 * is NULL (errno EINVAL).
 */
int vale_set_busy_wait(struct vale_port *p, int64_t spin_us);

/* The message of this thread's last failed libvale call ("" if none).  The string stays
 * valid until the thread's next libvale call. */
const char *vale_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* VALE_H */
