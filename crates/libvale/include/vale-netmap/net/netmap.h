/*
 * net/netmap.h -- netmap's kernel interface (API 14) as vale provides it.
 *
 * vale emulates netmap's control device in user space (the preload library
 * libvale-netmap.so, see the README's "Running netmap programs"), so a netmap program
 * compiled against these headers, or built long ago against netmap's own, finds the same
 * structures, constants and ioctl numbers here.  The layout of every structure is netmap's:
 * it is an interface fact, written down here from the layout alone.  Where vale's meaning
 * differs (a feature vale refuses, a field it ignores) the comment says so.
 *
 * The include guard is netmap's own, so including netmap's header and this one does no harm:
 * the first one included wins, and they agree byte for byte.
 */
#ifndef _NET_NETMAP_H_
#define _NET_NETMAP_H_

#include <stdint.h>
#include <sys/types.h>
#include <sys/time.h>
#include <sys/ioctl.h>
#include <net/if.h> /* IFNAMSIZ */
#ifndef IFNAMSIZ /* hidden by a strict -std=c11 */
#define IFNAMSIZ 16
#endif

#define NETMAP_API 14          /* the API version these structures describe */
#define NETMAP_MIN_API 14      /* vale speaks exactly this one */
#define NETMAP_MAX_API 15

#define NM_CACHE_ALIGN 128

#define NMV_ALIGNED(n) __attribute__((__aligned__(n)))
#ifdef __cplusplus
#define NMV_FLEX __extension__ /* flexible array members are an extension in C++ */
#else
#define NMV_FLEX
#endif

/* Flags of netmap_slot.flags. */
#define NS_BUF_CHANGED 0x0001 /* the client put a different buffer index into this slot */
#define NS_REPORT 0x0002      /* netmap: ask for a completion report; vale ignores it */
#define NS_FORWARD 0x0004     /* netmap: host-stack forwarding; vale ignores it */
#define NS_NO_LEARN 0x0008    /* the learning bridge must not learn this frame's source */
#define NS_INDIRECT 0x0010    /* ptr holds the payload address: refused by vale (bad input) */
#define NS_MOREFRAG 0x0020    /* the frame goes on in the next slot */

/*
 * One descriptor of a ring: which buffer, how many bytes of it, flags.  16 bytes.
 * `ptr` is unused by vale (NS_INDIRECT is not supported).
 */
struct netmap_slot {
	uint32_t buf_idx;
	uint16_t len;
	uint16_t flags;
	uint64_t ptr;
};

/*
 * A ring: a 256-byte header followed by num_slots slots.  The client owns the slots from
 * `head` up to (not including) `tail`; valed owns the rest.  The client moves head/cur
 * forward and publishes them with vale_txsync/vale_rxsync; `tail` changes only inside those
 * calls (and vale_poll).  The fields marked const are written by valed when the port is
 * created, or by libvale, and are never written by the program.
 */
struct netmap_ring {
	const int64_t buf_ofs;      /* buffer 0 is at (char *)ring + buf_ofs */
	const uint32_t num_slots;   /* slots in this ring, a power of two */
	const uint32_t nr_buf_size; /* bytes per buffer, a multiple of 64 */
	const uint16_t ringid;      /* index of this ring among the port's tx (or rx) rings */
	const uint16_t dir;         /* NR_TX or NR_RX */

	uint32_t head;       /* first slot the client still owns (written by the client) */
	uint32_t cur;        /* wake-up point: wait until tail passes cur (written by the client) */
	const uint32_t tail; /* first slot valed owns (refreshed by the sync calls) */

	uint32_t flags;    /* unused by vale */
	struct timeval ts; /* unused by vale */

	const uint64_t offset_mask; /* API 14 buffer offsets: 0 in vale */
	const uint64_t buf_align;   /* API 14 buffer offsets: 0 in vale */

	uint8_t sem[128] NMV_ALIGNED(128); /* opaque in netmap, unused by vale */

	NMV_FLEX struct netmap_slot slot[] NMV_ALIGNED(128); /* at offset 256 */
};

/*
 * The interface descriptor: how many rings there are and where each one is.  56 bytes,
 * then ring_ofs[], one entry per ring, each an offset from this structure.  The order is
 * netmap's: tx rings, host tx rings, rx rings, host rx rings.  vale ports have no host
 * rings, so ring_ofs[] holds ni_tx_rings tx rings then ni_rx_rings rx rings.
 */
struct netmap_if {
	char ni_name[16];                /* the port name, cut to 15 bytes, NUL-terminated */
	const uint32_t ni_version;       /* NETMAP_API */
	const uint32_t ni_flags;         /* 0 */
	const uint32_t ni_tx_rings;
	const uint32_t ni_rx_rings;
	uint32_t ni_bufs_head;           /* netmap's extra-buffer list: always 0 (none) in vale */
	const uint32_t ni_host_tx_rings; /* 0 in vale */
	const uint32_t ni_host_rx_rings; /* 0 in vale */
	uint32_t ni_spare1[3];
	NMV_FLEX const int64_t ring_ofs[]; /* netmap declares these ssize_t: same size here */
};

/*
 * The Communication Status Block of one ring: two 64-byte halves, each written by one side
 * only, each on its own cache line.  libvale's sync calls do all the CSB work; a program
 * only needs these if it implements the protocol itself (see docs/abi.md, with atomic
 * accesses and the fences described there).
 */
struct nm_csb_atok {             /* application (client) to kernel (valed) */
	uint32_t head;           /* the client's ring->head */
	uint32_t cur;            /* the client's ring->cur */
	uint32_t appl_need_kick; /* 1: the client sleeps, valed must raise the interrupt fd */
	uint32_t sync_flags;     /* flags of the last sync, informational */
	uint32_t pad[12];
} NMV_ALIGNED(64);

struct nm_csb_ktoa {             /* kernel (valed) to application (client) */
	uint32_t hwcur;          /* first slot valed has not processed yet */
	uint32_t hwtail;         /* becomes the client's ring->tail */
	uint32_t kern_need_kick; /* 1: valed sleeps on this ring, the client must kick */
	uint32_t pad[13];
} NMV_ALIGNED(64);

/* Values of netmap_ring.dir. */
#define NR_TX 0
#define NR_RX 1

/* Flags of netmap_ring.flags. */
#define NR_TIMESTAMP 0x0002 /* netmap: fill ring->ts on sync; vale leaves ts alone */
#define NR_FORWARD 0x0004   /* netmap: host-stack forwarding; no host rings in vale */

/* netmap_if.ni_flags */
#define NI_PRIV_MEM 0x1 /* the port's memory is its own: always so in vale */

/*
 * Nothing for the client between head and tail: no frame to read on an rx ring, no free
 * slot on a tx ring.  (netmap's definition: head, not cur.)
 */
static inline int nm_ring_empty(struct netmap_ring *ring)
{
	return ring->head == ring->tail;
}

/* ------------------------------------------------------------------------------------------ */
/* The control requests (NIOCCTRL)                                                            */
/* ------------------------------------------------------------------------------------------ */

#define NETMAP_REQ_MAXSIZE 4096
#define NETMAP_REQ_IFNAMSIZ 64

/* One option of a request, chained through nro_next.  vale accepts none (see below). */
struct nmreq_option {
	uint64_t nro_next;    /* the next option (a pointer), 0 at the end */
	uint32_t nro_reqtype; /* NETMAP_REQ_OPT_* */
	uint32_t nro_status;  /* out: 0, or the errno the option failed with */
	uint64_t nro_size;    /* size of a variable-size option, else 0 */
};

/* What every NIOCCTRL request starts with. */
struct nmreq_header {
	uint16_t nr_version; /* NETMAP_API */
	uint16_t nr_reqtype; /* NETMAP_REQ_* */
	uint32_t nr_reserved; /* 0 */
	char nr_name[NETMAP_REQ_IFNAMSIZ]; /* the port: "valeX:Y" */
	uint64_t nr_options; /* first struct nmreq_option (a pointer), or 0 */
	uint64_t nr_body;    /* the request's body (a pointer) */
};

/* nmreq_header.nr_reqtype.  vale serves REGISTER, PORT_INFO_GET, PORT_HDR_GET and
 * PORT_HDR_SET (length 0 only); the switch requests (VALE_*) are vale-ctl's job. */
enum {
	NETMAP_REQ_REGISTER = 1,
	NETMAP_REQ_PORT_INFO_GET,
	NETMAP_REQ_VALE_ATTACH,
	NETMAP_REQ_VALE_DETACH,
	NETMAP_REQ_VALE_LIST,
	NETMAP_REQ_PORT_HDR_SET,
	NETMAP_REQ_PORT_HDR_GET,
	NETMAP_REQ_VALE_NEWIF,
	NETMAP_REQ_VALE_DELIF,
	NETMAP_REQ_VALE_POLLING_ENABLE,
	NETMAP_REQ_VALE_POLLING_DISABLE,
	NETMAP_REQ_POOLS_INFO_GET,
	NETMAP_REQ_SYNC_KLOOP_START,
	NETMAP_REQ_SYNC_KLOOP_STOP,
	NETMAP_REQ_CSB_ENABLE,
};

/* nmreq_option.nro_reqtype.  vale refuses each of them by name. */
enum {
	NETMAP_REQ_OPT_EXTMEM = 1,
	NETMAP_REQ_OPT_SYNC_KLOOP_EVENTFDS,
	NETMAP_REQ_OPT_CSB,
	NETMAP_REQ_OPT_SYNC_KLOOP_MODE,
	NETMAP_REQ_OPT_OFFSETS,
	NETMAP_REQ_OPT_MAX,
};

/* NETMAP_REQ_REGISTER: bind the descriptor to a port (created if need be). */
struct nmreq_register {
	uint64_t nr_offset;   /* out: offset of the netmap_if in the mapping */
	uint64_t nr_memsize;  /* out: bytes to mmap */
	uint32_t nr_tx_slots; /* in (0: default) / out */
	uint32_t nr_rx_slots; /* in (0: default) / out; vale ports have one size for both */
	uint16_t nr_tx_rings; /* in (0: default) / out */
	uint16_t nr_rx_rings; /* in (0: default) / out */
	uint16_t nr_host_tx_rings; /* out: 0, vale ports have no host rings */
	uint16_t nr_host_rx_rings; /* out: 0 */
	uint16_t nr_mem_id;   /* out: an identifier of the port's own memory */
	uint16_t nr_ringid;   /* in: the ring of NR_REG_ONE_NIC */
	uint32_t nr_mode;     /* in: NR_REG_* */
	uint32_t nr_extra_bufs; /* in: must be 0 (vale has no extra buffers) */
	uint64_t nr_flags;    /* in: NR_* flags below */
#define NR_MONITOR_TX 0x100   /* refused: capture with vale-ctl capture */
#define NR_MONITOR_RX 0x200   /* refused */
#define NR_ZCOPY_MON 0x400    /* refused */
#define NR_EXCLUSIVE 0x800    /* accepted: a vale port has one owner anyway */
#define NR_RX_RINGS_ONLY 0x2000 /* bind the rx rings only */
#define NR_TX_RINGS_ONLY 0x4000 /* bind the tx rings only */
#define NR_ACCEPT_VNET_HDR 0x8000 /* accepted: vale ports carry no virtio-net header */
#define NR_DO_RX_POLL 0x10000 /* poll() also syncs rx rings when POLLIN is not asked */
#define NR_NO_TX_POLL 0x20000 /* poll() syncs tx rings only when POLLOUT is asked */
};

/* nmreq_register.nr_mode */
enum {
	NR_REG_DEFAULT = 0, /* as NR_REG_ALL_NIC */
	NR_REG_ALL_NIC = 1, /* every ring of the port */
	NR_REG_SW = 2,      /* refused: host rings */
	NR_REG_NIC_SW = 3,  /* refused: host rings */
	NR_REG_ONE_NIC = 4, /* tx and rx ring nr_ringid */
	NR_REG_PIPE_MASTER = 5, /* refused: netmap pipes */
	NR_REG_PIPE_SLAVE = 6,  /* refused: netmap pipes */
	NR_REG_NULL = 7,    /* refused */
	NR_REG_ONE_SW = 8,  /* refused: host rings */
};

/* One ioctl number for every control request; the header says which. */
#define NIOCCTRL _IOWR('i', 151, struct nmreq_header)
/* Sync the bound tx (rx) rings; no argument, never blocks. */
#define NIOCTXSYNC _IO('i', 148)
#define NIOCRXSYNC _IO('i', 149)

/* NETMAP_REQ_PORT_INFO_GET: the geometry of a port, without binding to it. */
struct nmreq_port_info_get {
	uint64_t nr_memsize;
	uint32_t nr_tx_slots;
	uint32_t nr_rx_slots;
	uint16_t nr_tx_rings;
	uint16_t nr_rx_rings;
	uint16_t nr_host_tx_rings;
	uint16_t nr_host_rx_rings;
	uint16_t nr_mem_id;
	uint16_t pad[3];
};

#define NM_BDG_NAME "vale" /* the prefix of a switch port name */

/* NETMAP_REQ_PORT_HDR_SET / _GET: the virtio-net header length (always 0 on vale). */
struct nmreq_port_hdr {
	uint32_t nr_hdr_len;
	uint32_t nr_pad;
};

/* ------------------------------------------------------------------------------------------ */
/* The legacy control requests (NIOCREGIF, NIOCGINFO), used by nm_open()                     */
/* ------------------------------------------------------------------------------------------ */

struct nmreq {
	char nr_name[IFNAMSIZ];
	uint32_t nr_version;  /* NETMAP_API */
	uint32_t nr_offset;   /* out: offset of the netmap_if */
	uint32_t nr_memsize;  /* out: bytes to mmap */
	uint32_t nr_tx_slots;
	uint32_t nr_rx_slots;
	uint16_t nr_tx_rings;
	uint16_t nr_rx_rings;
	uint16_t nr_ringid;   /* NETMAP_* ring flags below, or a ring number */
#define NETMAP_HW_RING 0x4000 /* one ring pair: NETMAP_RING_MASK gives which */
#define NETMAP_SW_RING 0x2000 /* refused: host rings */
#define NETMAP_RING_MASK 0x0fff
#define NETMAP_NO_TX_POLL 0x1000
#define NETMAP_DO_RX_POLL 0x8000
	uint16_t nr_cmd;      /* 0: register; the NETMAP_BDG_* switch commands are refused */
#define NETMAP_BDG_ATTACH 1
#define NETMAP_BDG_DETACH 2
#define NETMAP_BDG_REGOPS 3
#define NETMAP_BDG_LIST 4
#define NETMAP_BDG_VNET_HDR 5
#define NETMAP_BDG_NEWIF 6
#define NETMAP_BDG_DELIF 7
#define NETMAP_PT_HOST_CREATE 8
#define NETMAP_PT_HOST_DELETE 9
#define NETMAP_BDG_POLLING_ON 10
#define NETMAP_BDG_POLLING_OFF 11
#define NETMAP_VNET_HDR_GET 12
	uint16_t nr_arg1;
#define NETMAP_BDG_HOST 1
	uint16_t nr_arg2;     /* out: memory identifier */
	uint32_t nr_arg3;     /* in: extra buffers: must be 0 */
	uint32_t nr_flags;    /* NR_REG_* in the low bits, NR_* flags */
#define NR_REG_MASK 0xf
	uint32_t spare2[1];
};

#define NIOCGINFO _IOWR('i', 145, struct nmreq)
#define NIOCREGIF _IOWR('i', 146, struct nmreq)

#endif /* _NET_NETMAP_H_ */
