/*
 * nmport.c -- vale's libnetmap: netmap's nmport_* port library over the control device.
 *
 * Plain C over open("/dev/netmap"), ioctl(NIOCCTRL) and mmap(), as netmap's own library is,
 * so it runs wherever those calls are served: on vale by libvale-netmap.so (linked or
 * preloaded).  Built into libnetmap.a; see libnetmap.h for the port name syntax.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "libnetmap.h"

/* ---------------------------------------------------------------------------------------- */
/* The context                                                                              */
/* ---------------------------------------------------------------------------------------- */

static pthread_mutex_t nmctx_mutex = PTHREAD_MUTEX_INITIALIZER;

static void default_error(struct nmctx *ctx, const char *msg)
{
	(void)ctx;
	fprintf(stderr, "%s\n", msg);
}

static void *default_malloc(struct nmctx *ctx, size_t size)
{
	(void)ctx;
	return calloc(1, size);
}

static void default_free(struct nmctx *ctx, void *p)
{
	(void)ctx;
	free(p);
}

static void default_lock(struct nmctx *ctx, int lock)
{
	(void)ctx;
	if (lock)
		pthread_mutex_lock(&nmctx_mutex);
	else
		pthread_mutex_unlock(&nmctx_mutex);
}

static struct nmctx nmctx_global = {
	.verbose = 1,
	.error = default_error,
	.malloc = default_malloc,
	.free = default_free,
	.lock = default_lock,
	.mem_descs = NULL,
};

static struct nmctx *nmctx_default = &nmctx_global;

struct nmctx *nmctx_get(void)
{
	return nmctx_default;
}

struct nmctx *nmctx_set_default(struct nmctx *ctx)
{
	struct nmctx *old = nmctx_default;
	nmctx_default = ctx ? ctx : &nmctx_global;
	return old;
}

void nmctx_set_threadsafe(void)
{
	/* always thread-safe: the default lock is a mutex */
}

void nmctx_ferror(struct nmctx *ctx, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!ctx->verbose)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ctx->error(ctx, msg);
}

void *nmctx_malloc(struct nmctx *ctx, size_t size)
{
	return ctx->malloc(ctx, size);
}

void nmctx_free(struct nmctx *ctx, void *p)
{
	ctx->free(ctx, p);
}

void nmctx_lock(struct nmctx *ctx)
{
	if (ctx->lock)
		ctx->lock(ctx, 1);
}

void nmctx_unlock(struct nmctx *ctx)
{
	if (ctx->lock)
		ctx->lock(ctx, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests                                                                                 */
/* ---------------------------------------------------------------------------------------- */

void nmreq_header_init(struct nmreq_header *hdr, uint16_t reqtype, void *body)
{
	memset(hdr, 0, sizeof(*hdr));
	hdr->nr_version = NETMAP_API;
	hdr->nr_reqtype = reqtype;
	hdr->nr_body = (uintptr_t)body;
}

void nmreq_push_option(struct nmreq_header *hdr, struct nmreq_option *opt)
{
	opt->nro_next = hdr->nr_options;
	hdr->nr_options = (uintptr_t)opt;
}

void nmreq_remove_option(struct nmreq_header *hdr, struct nmreq_option *opt)
{
	uint64_t *link = &hdr->nr_options;

	while (*link) {
		struct nmreq_option *o = (struct nmreq_option *)(uintptr_t)*link;
		if (o == opt) {
			*link = o->nro_next;
			o->nro_next = 0;
			return;
		}
		link = &o->nro_next;
	}
}

struct nmreq_option *nmreq_find_option(struct nmreq_header *hdr, uint32_t reqtype)
{
	struct nmreq_option *o;

	nmreq_foreach_option(hdr, o)
	{
		if (o->nro_reqtype == reqtype)
			return o;
	}
	return NULL;
}

const char *nmreq_option_name(uint32_t reqtype)
{
	switch (reqtype) {
	case NETMAP_REQ_OPT_EXTMEM: return "extmem";
	case NETMAP_REQ_OPT_SYNC_KLOOP_EVENTFDS: return "sync-kloop-eventfds";
	case NETMAP_REQ_OPT_CSB: return "csb";
	case NETMAP_REQ_OPT_SYNC_KLOOP_MODE: return "sync-kloop-mode";
	case NETMAP_REQ_OPT_OFFSETS: return "offset";
	default: return "unknown";
	}
}

/* ---------------------------------------------------------------------------------------- */
/* Parsing a port specification                                                             */
/* ---------------------------------------------------------------------------------------- */

static int fail(struct nmport_d *d, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(struct nmport_d *d, int err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	nmctx_ferror(d->ctx, "%s", msg);
	errno = err;
	return -1;
}

static int name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.' || c == ':';
}

/* "@conf:key=value,...": sizes of a port this open creates. */
static int parse_conf(struct nmport_d *d, const char *spec, const char *p)
{
	while (*p) {
		char key[32];
		size_t n = strcspn(p, "=,");
		char *end;
		unsigned long v;

		if (n == 0 || n >= sizeof(key) || p[n] != '=')
			return fail(d, EINVAL, "%s: bad @conf entry at '%s'", spec, p);
		memcpy(key, p, n);
		key[n] = '\0';
		v = strtoul(p + n + 1, &end, 0);
		if (end == p + n + 1 || v > 0xffff)
			return fail(d, EINVAL, "%s: bad value for %s", spec, key);
		if (strcmp(key, "rings") == 0) {
			d->reg.nr_tx_rings = d->reg.nr_rx_rings = (uint16_t)v;
		} else if (strcmp(key, "tx-rings") == 0) {
			d->reg.nr_tx_rings = (uint16_t)v;
		} else if (strcmp(key, "rx-rings") == 0) {
			d->reg.nr_rx_rings = (uint16_t)v;
		} else if (strcmp(key, "slots") == 0) {
			d->reg.nr_tx_slots = d->reg.nr_rx_slots = (uint32_t)v;
		} else if (strcmp(key, "tx-slots") == 0) {
			d->reg.nr_tx_slots = (uint32_t)v;
		} else if (strcmp(key, "rx-slots") == 0) {
			d->reg.nr_rx_slots = (uint32_t)v;
		} else if (strncmp(key, "host-", 5) == 0) {
			if (v != 0)
				return fail(d, EOPNOTSUPP,
					    "%s: host rings are not available on vale: a vale port has no host stack behind it",
					    spec);
		} else {
			return fail(d, EINVAL, "%s: unknown @conf key '%s'", spec, key);
		}
		p = end;
		if (*p == ',')
			p++;
		else if (*p)
			return fail(d, EINVAL, "%s: unexpected '%s'", spec, p);
	}
	return 0;
}

int nmport_parse(struct nmport_d *d, const char *spec)
{
	const char *p = spec, *name;
	size_t n;

	if (spec == NULL)
		return fail(d, EINVAL, "nmport_parse: no port name");
	if (strncmp(p, "netmap:", 7) == 0)
		p += 7;
	name = p;
	while (*p && name_char(*p))
		p++;
	n = (size_t)(p - name);
	if (n == 0 || n >= sizeof(d->hdr.nr_name))
		return fail(d, EINVAL, "%s: the port name is empty or longer than %zu bytes", spec,
			    sizeof(d->hdr.nr_name) - 1);
	nmreq_header_init(&d->hdr, NETMAP_REQ_REGISTER, &d->reg);
	memcpy(d->hdr.nr_name, name, n);
	d->hdr.nr_name[n] = '\0';
	d->reg.nr_mode = NR_REG_ALL_NIC;
	switch (*p) {
	case '-': d->reg.nr_mode = NR_REG_ONE_NIC; break;
	case '*': d->reg.nr_mode = NR_REG_NIC_SW; p++; break;
	case '^': d->reg.nr_mode = NR_REG_SW; p++; break;
	case '{': d->reg.nr_mode = NR_REG_PIPE_MASTER; break;
	case '}': d->reg.nr_mode = NR_REG_PIPE_SLAVE; break;
	}
	if (*p == '-' || *p == '{' || *p == '}') {
		char *end;
		unsigned long r = strtoul(p + 1, &end, 10);
		if (end == p + 1 || r > 0xffff)
			return fail(d, EINVAL, "%s: bad ring number", spec);
		d->reg.nr_ringid = (uint16_t)r;
		p = end;
	}
	if (*p == '/') {
		for (p++; *p && *p != '@'; p++) {
			switch (*p) {
			case 'x': d->reg.nr_flags |= NR_EXCLUSIVE; break;
			case 'z': d->reg.nr_flags |= NR_ZCOPY_MON; break;
			case 't': d->reg.nr_flags |= NR_MONITOR_TX; break;
			case 'r': d->reg.nr_flags |= NR_MONITOR_RX; break;
			case 'R': d->reg.nr_flags |= NR_RX_RINGS_ONLY; break;
			case 'T': d->reg.nr_flags |= NR_TX_RINGS_ONLY; break;
			default: return fail(d, EINVAL, "%s: unknown flag '%c'", spec, *p);
			}
		}
	}
	while (*p == '@') {
		const char *opt = p + 1, *body;
		size_t len = strcspn(opt, "@");
		char buf[256];

		if (len >= sizeof(buf))
			return fail(d, EINVAL, "%s: option too long", spec);
		memcpy(buf, opt, len);
		buf[len] = '\0';
		p = opt + len;
		if (buf[0] >= '0' && buf[0] <= '9')
			continue; /* a memory identifier: every vale port has its own memory */
		body = strchr(buf, ':');
		if (strncmp(buf, "conf:", 5) == 0) {
			if (parse_conf(d, spec, body + 1) < 0)
				return -1;
		} else if (strncmp(buf, "extmem", 6) == 0) {
			return fail(d, EOPNOTSUPP,
				    "%s: external memory (@extmem) is not available on vale: a vale port's memory is valed's own",
				    spec);
		} else if (strncmp(buf, "offset", 6) == 0) {
			return fail(d, EOPNOTSUPP,
				    "%s: buffer offsets (@offset) are not available on vale", spec);
		} else {
			return fail(d, EINVAL, "%s: unknown option '@%s'", spec, buf);
		}
	}
	if (*p)
		return fail(d, EINVAL, "%s: unexpected '%s'", spec, p);
	return 0;
}

void nmport_undo_parse(struct nmport_d *d)
{
	memset(&d->hdr, 0, sizeof(d->hdr));
	memset(&d->reg, 0, sizeof(d->reg));
}

/* ---------------------------------------------------------------------------------------- */
/* Descriptors                                                                              */
/* ---------------------------------------------------------------------------------------- */

struct nmport_d *nmport_new(void)
{
	struct nmctx *ctx = nmctx_get();
	struct nmport_d *d = nmctx_malloc(ctx, sizeof(*d));

	if (d == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	memset(d, 0, sizeof(*d));
	d->ctx = ctx;
	d->fd = -1;
	return d;
}

void nmport_delete(struct nmport_d *d)
{
	if (d)
		nmctx_free(d->ctx, d);
}

struct nmport_d *nmport_prepare(const char *spec)
{
	struct nmport_d *d = nmport_new();

	if (d == NULL)
		return NULL;
	if (nmport_parse(d, spec) < 0) {
		int e = errno;
		nmport_delete(d);
		errno = e;
		return NULL;
	}
	return d;
}

void nmport_undo_prepare(struct nmport_d *d)
{
	if (d == NULL)
		return;
	nmport_undo_parse(d);
	nmport_delete(d);
}

int nmport_register(struct nmport_d *d)
{
	if (d->register_done)
		return fail(d, EINVAL, "%s: registered already", d->hdr.nr_name);
	d->fd = open(NETMAP_DEVICE_NAME, O_RDWR | O_CLOEXEC);
	if (d->fd < 0)
		return fail(d, errno, "cannot open %s: %s", NETMAP_DEVICE_NAME, strerror(errno));
	if (ioctl(d->fd, NIOCCTRL, &d->hdr) < 0) {
		int e = errno;
		close(d->fd);
		d->fd = -1;
		return fail(d, e, "%s: cannot register: %s", d->hdr.nr_name, strerror(e));
	}
	d->register_done = 1;
	return 0;
}

void nmport_undo_register(struct nmport_d *d)
{
	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
	d->register_done = 0;
}

int nmport_mmap(struct nmport_d *d)
{
	struct nmctx *ctx = d->ctx;
	struct nmem_d *m;
	if (!d->register_done)
		return fail(d, EINVAL, "nmport_mmap: the port is not registered");
	if (d->mmap_done)
		return 0;
	nmctx_lock(ctx);
	for (m = ctx->mem_descs; m; m = m->next)
		if (m->mem_id == d->reg.nr_mem_id && m->size == d->reg.nr_memsize)
			break;
	if (m == NULL) {
		void *mem = mmap(NULL, d->reg.nr_memsize, PROT_READ | PROT_WRITE, MAP_SHARED, d->fd, 0);
		if (mem == MAP_FAILED) {
			int e = errno;
			nmctx_unlock(ctx);
			return fail(d, e, "%s: mmap: %s", d->hdr.nr_name, strerror(e));
		}
		m = nmctx_malloc(ctx, sizeof(*m));
		if (m == NULL) {
			munmap(mem, d->reg.nr_memsize);
			nmctx_unlock(ctx);
			return fail(d, ENOMEM, "%s: out of memory", d->hdr.nr_name);
		}
		memset(m, 0, sizeof(*m));
		m->mem_id = d->reg.nr_mem_id;
		m->mem = mem;
		m->size = d->reg.nr_memsize;
		m->next = ctx->mem_descs;
		if (m->next)
			m->next->prev = m;
		ctx->mem_descs = m;
	}
	m->refcount++;
	nmctx_unlock(ctx);

	d->mem = m;
	d->nifp = NETMAP_IF(m->mem, d->reg.nr_offset);
	/* The rings bound to this descriptor are those its netmap_if gives an offset for
	 * (each registration has a netmap_if of its own): a range, as netmap binds them. */
	{
		uint32_t ntx = d->nifp->ni_tx_rings, nrx = d->nifp->ni_rx_rings, i;

		for (i = 0; i < ntx && !d->nifp->ring_ofs[i]; i++)
			;
		d->first_tx_ring = (uint16_t)i;
		for (; i < ntx && d->nifp->ring_ofs[i]; i++)
			;
		d->last_tx_ring = (uint16_t)(i - 1); /* first > last: no tx ring */
		for (i = 0; i < nrx && !d->nifp->ring_ofs[ntx + i]; i++)
			;
		d->first_rx_ring = (uint16_t)i;
		for (; i < nrx && d->nifp->ring_ofs[ntx + i]; i++)
			;
		d->last_rx_ring = (uint16_t)(i - 1);
	}
	d->cur_tx_ring = d->first_tx_ring;
	d->cur_rx_ring = d->first_rx_ring;
	d->mmap_done = 1;
	return 0;
}

void nmport_undo_mmap(struct nmport_d *d)
{
	struct nmctx *ctx = d->ctx;
	struct nmem_d *m = d->mem;

	if (!d->mmap_done || m == NULL)
		return;
	nmctx_lock(ctx);
	if (--m->refcount == 0) {
		munmap(m->mem, m->size);
		if (m->prev)
			m->prev->next = m->next;
		else
			ctx->mem_descs = m->next;
		if (m->next)
			m->next->prev = m->prev;
		nmctx_free(ctx, m);
	}
	nmctx_unlock(ctx);
	d->mem = NULL;
	d->nifp = NULL;
	d->mmap_done = 0;
}

int nmport_open_desc(struct nmport_d *d)
{
	if (nmport_register(d) < 0)
		return -1;
	if (nmport_mmap(d) < 0) {
		int e = errno;
		nmport_undo_register(d);
		errno = e;
		return -1;
	}
	return 0;
}

void nmport_undo_open_desc(struct nmport_d *d)
{
	nmport_undo_mmap(d);
	nmport_undo_register(d);
}

struct nmport_d *nmport_open(const char *spec)
{
	struct nmport_d *d = nmport_prepare(spec);

	if (d == NULL)
		return NULL;
	if (nmport_open_desc(d) < 0) {
		int e = errno;
		nmport_undo_prepare(d);
		errno = e;
		return NULL;
	}
	return d;
}

void nmport_close(struct nmport_d *d)
{
	if (d == NULL)
		return;
	nmport_undo_open_desc(d);
	nmport_undo_prepare(d);
}

struct nmport_d *nmport_clone(struct nmport_d *d)
{
	struct nmport_d *c = nmport_new();

	if (c == NULL)
		return NULL;
	c->hdr = d->hdr;
	c->hdr.nr_body = (uintptr_t)&c->reg;
	c->hdr.nr_options = 0;
	c->reg = d->reg;
	c->ctx = d->ctx;
	return c;
}

int nmport_inject(struct nmport_d *d, const void *buf, size_t size)
{
	return nmv_inject_(d->nifp, d->first_tx_ring, d->last_tx_ring, &d->cur_tx_ring, buf, size);
}

/* ---------------------------------------------------------------------------------------- */
/* What vale refuses                                                                        */
/* ---------------------------------------------------------------------------------------- */

int nmport_extmem(struct nmport_d *d, void *base, size_t size)
{
	(void)base;
	(void)size;
	return fail(d, EOPNOTSUPP,
		    "%s: external memory is not available on vale: a vale port's memory is valed's own",
		    d->hdr.nr_name);
}

int nmport_extmem_from_file(struct nmport_d *d, const char *fname)
{
	(void)fname;
	return nmport_extmem(d, NULL, 0);
}

int nmport_offset(struct nmport_d *d, uint64_t initial, uint64_t maxoff, uint64_t bits, uint64_t mingap)
{
	(void)initial;
	(void)maxoff;
	(void)bits;
	(void)mingap;
	return fail(d, EOPNOTSUPP, "%s: buffer offsets are not available on vale", d->hdr.nr_name);
}

int nmport_enable_option(const char *opt)
{
	if (opt && strcmp(opt, "conf") == 0)
		return 0;
	nmctx_ferror(nmctx_get(), "option '%s' is not available on vale (only 'conf' is)",
		     opt ? opt : "(null)");
	errno = EOPNOTSUPP;
	return -1;
}

void nmport_disable_option(const char *opt)
{
	(void)opt;
}
