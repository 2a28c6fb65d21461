/*
 * libnetmap.h -- netmap's port library (nmport_*) as vale provides it.
 *
 * The same functions and descriptor as netmap's libnetmap, written for vale over netmap's
 * control device calls (open, ioctl NIOCCTRL, mmap), which libvale-netmap.so serves.  Build a
 * netmap program against these headers and link it with -lnetmap (vale's libnetmap.a) and
 * -lvale-netmap; or run a program built against netmap's own library with
 * LD_PRELOAD=libvale-netmap.so.
 *
 * Port names: "valeX:Y" with netmap's suffixes: "-N" binds tx and rx ring N only, "/R" (rx
 * rings only), "/T" (tx rings only), "/x" (exclusive, as every vale port is), and the option
 * "@conf:rings=N,tx-rings=N,rx-rings=N,slots=N,tx-slots=N,rx-slots=N" to size a port that
 * this open creates.  Host rings ("^", "*"), pipes ("{N", "}N"), monitors ("/t", "/r", "/z"),
 * "@extmem" and "@offset" are refused with a message naming the feature.
 */
#ifndef LIBNETMAP_H_
#define LIBNETMAP_H_

#include <stddef.h>
#include <stdint.h>
#include <net/netmap_user.h>

#ifdef __cplusplus
extern "C" {
#endif

struct nmctx;
struct nmem_d;
struct nmreq_opt_extmem; /* never used on vale: extmem is refused */
struct nmport_cleanup_d;

/* An open port (or some of its rings). */
struct nmport_d {
	struct nmreq_header hdr; /* the register request; hdr.nr_name is the port */
	struct nmreq_register reg;
	struct nmem_d *mem;      /* the mapping, shared by the descriptors of one port */
	struct nmctx *ctx;
	int register_done;
	int mmap_done;
	struct nmreq_opt_extmem *extmem; /* always NULL */
	int fd;                  /* the control descriptor (-1 until registered): poll it */
	struct netmap_if *nifp;
	uint16_t first_tx_ring;
	uint16_t last_tx_ring;
	uint16_t first_rx_ring;
	uint16_t last_rx_ring;
	uint16_t cur_tx_ring;    /* where nmport_inject() goes on */
	uint16_t cur_rx_ring;
	struct nmport_cleanup_d *clist;
};

/* Parses, registers and maps portspec.  NULL on error (errno set, the reason on stderr). */
struct nmport_d *nmport_open(const char *portspec);
/* Undoes nmport_open(). */
void nmport_close(struct nmport_d *d);
/* Copies one frame into a bound tx ring with room: size, or 0 if none has room. */
int nmport_inject(struct nmport_d *d, const void *buf, size_t size);

/* nmport_open() in steps: new + parse = prepare; register + mmap = open_desc. */
struct nmport_d *nmport_new(void);
int nmport_parse(struct nmport_d *d, const char *portspec);
int nmport_register(struct nmport_d *d);
int nmport_mmap(struct nmport_d *d);
void nmport_delete(struct nmport_d *d);
void nmport_undo_parse(struct nmport_d *d);
void nmport_undo_register(struct nmport_d *d);
void nmport_undo_mmap(struct nmport_d *d);
struct nmport_d *nmport_prepare(const char *portspec);
int nmport_open_desc(struct nmport_d *d);
void nmport_undo_prepare(struct nmport_d *d);
void nmport_undo_open_desc(struct nmport_d *d);
/* A new descriptor for the same port and request, not yet registered. */
struct nmport_d *nmport_clone(struct nmport_d *d);

/* Refused on vale (-1, errno EOPNOTSUPP): memory from the program, buffer offsets. */
int nmport_extmem(struct nmport_d *d, void *base, size_t size);
int nmport_extmem_from_file(struct nmport_d *d, const char *fname);
int nmport_offset(struct nmport_d *d, uint64_t initial, uint64_t maxoff, uint64_t bits, uint64_t mingap);
/* Options ("conf" is always on; the others are refused). */
int nmport_enable_option(const char *opt);
void nmport_disable_option(const char *opt);

/* Request helpers. */
void nmreq_header_init(struct nmreq_header *hdr, uint16_t reqtype, void *body);
void nmreq_push_option(struct nmreq_header *hdr, struct nmreq_option *opt);
void nmreq_remove_option(struct nmreq_header *hdr, struct nmreq_option *opt);
struct nmreq_option *nmreq_find_option(struct nmreq_header *hdr, uint32_t reqtype);
const char *nmreq_option_name(uint32_t reqtype);

#define nmreq_foreach_option(h_, o_)                                         \
	for ((o_) = (struct nmreq_option *)((uintptr_t)((h_)->nr_options)); \
	     (o_) != NULL; (o_) = (struct nmreq_option *)((uintptr_t)((o_)->nro_next)))

/* The context: how errors are reported, memory allocated and the library locked. */
typedef void (*nmctx_error_cb)(struct nmctx *, const char *);
typedef void *(*nmctx_malloc_cb)(struct nmctx *, size_t);
typedef void (*nmctx_free_cb)(struct nmctx *, void *);
typedef void (*nmctx_lock_cb)(struct nmctx *, int);

struct nmctx {
	int verbose;
	nmctx_error_cb error;
	nmctx_malloc_cb malloc;
	nmctx_free_cb free;
	nmctx_lock_cb lock;
	struct nmem_d *mem_descs;
};

struct nmctx *nmctx_get(void);
struct nmctx *nmctx_set_default(struct nmctx *ctx);
void nmctx_set_threadsafe(void);
void nmctx_ferror(struct nmctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *nmctx_malloc(struct nmctx *ctx, size_t size);
void nmctx_free(struct nmctx *ctx, void *p);
void nmctx_lock(struct nmctx *ctx);
void nmctx_unlock(struct nmctx *ctx);

/* One mapping, shared by the descriptors of a port (same nr_mem_id). */
struct nmem_d {
	uint16_t mem_id;
	int refcount;
	void *mem;
	size_t size;
	int is_extmem; /* always 0 */
	struct nmem_d *next;
	struct nmem_d *prev;
};

#ifdef __cplusplus
}
#endif

#endif /* LIBNETMAP_H_ */
