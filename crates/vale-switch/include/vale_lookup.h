/* vale_lookup.h: the interface of vale lookup modules loaded at run time.
 *
 * A lookup module decides where each frame of a batch goes (the lookup stage of the
 * switch's forwarding pipeline). Build it as a shared object that exports one function,
 *
 *     const struct vale_lookup_module *vale_lookup_module(void);
 *
 * and load it into a running switch with
 *
 *     vale-ctl lookup vale0 /path/to/module.so [--arg key=value ...]
 *
 * valed calls vale_lookup_module() once, checks abi_version against the versions it speaks
 * (VALE_LOOKUP_ABI_VERSION below, and older ones it names) and refuses a module of any
 * other version, or one missing
 * the symbol or a required function, leaving the switch's module as it was.
 *
 * Threads: lookup() is called by every forwarding thread, concurrently, for batches of
 * different source rings; port_added(), port_removed(), counters() and control() come from
 * the control thread (one at a time), concurrently with lookup(). A module keeps its state thread-safe (atomics; no lock
 * a lookup waits on for long). create() and destroy() are never concurrent with anything
 * else of the same instance. valed keeps the shared object loaded until destroy() has
 * returned and no thread can call into it any more.
 *
 * Versioning: VALE_LOOKUP_ABI_VERSION changes whenever the layout or meaning of anything
 * below changes. Fields marked reserved are 0 and are given a meaning only by a new version.
 */
#ifndef VALE_LOOKUP_H
#define VALE_LOOKUP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 3: the module may take commands of its own (control, open_ops). 2: vale_frame.ring is a
 * result. 1: it was ignored (valed still loads version 1 modules, and ignores what they write
 * there). valed loads modules of versions 1 to 3; a version 1 or 2 module's struct ends after
 * counters, and it takes no commands. */
#define VALE_LOOKUP_ABI_VERSION 3u

/* The room control() has for its answer: out_cap. */
#define VALE_CONTROL_OUT_CAP (1u << 20)
/* Reserved commands valed itself sends to control() (no client may send them): "vale.save"
 * asks for what the module wants kept in valed's configuration (`vale-ctl save`), as lines
 * of text; "vale.restore" hands those lines back (the body, '\n' between them) after the
 * module was made again from its arguments at valed's next start. A module that keeps
 * nothing answers them EOPNOTSUPP, or with nothing. */
#define VALE_OP_SAVE "vale.save"
#define VALE_OP_RESTORE "vale.restore"

/* Values of vale_frame.dst besides a port index. */
#define VALE_DST_FLOOD 0xffffu /* every other port of the switch */
#define VALE_DST_DROP 0xfffeu  /* nowhere: counted as a tx drop of the source port */
/* Most ports of a switch: port indices are below this. */
#define VALE_MAX_PORTS 2048u
/* vale_frame.ring: the switch chooses. */
#define VALE_RING_ANY 0xffffu

/* Flag of vale_frame.flags: the sender asks that its source address not be learnt. */
#define VALE_NS_NO_LEARN 0x0008u

/* One frame of a batch: 24 bytes. */
struct vale_frame {
    /* In: the frame's first bytes (the Ethernet header at least: first_len >= 14). They are
     * the sender's memory, which it may change at any time: read each byte once, never
     * write. */
    const uint8_t *data;
    uint32_t first_len; /* in: bytes readable at data */
    uint32_t len;       /* in: the whole frame's length, all fragments together */
    uint16_t flags;     /* in: flags of the frame's first slot (VALE_NS_NO_LEARN) */
    /* Out: a port index, VALE_DST_FLOOD or VALE_DST_DROP. It is VALE_DST_DROP when lookup()
     * is called. A port that is not on the switch (or the source port itself) is a drop,
     * counted as the source's tx drop and in the module's bad_dst counter. */
    uint16_t dst;
    /* Out: the destination's rx ring, or VALE_RING_ANY (as given: the ring the source's tx
     * ring maps to). A ring the destination does not have is a drop, counted as the
     * source's tx drop. Flooded frames go to each port's usual ring whatever is here. */
    uint16_t ring;
    uint16_t reserved; /* 0; what a module writes here is ignored */
};

/* One batch: frames gathered from one tx ring of one port, in order. */
struct vale_batch {
    struct vale_frame *frames;
    uint32_t count;
    uint16_t src_port;    /* index of the port the frames come from */
    uint16_t src_ring;    /* its tx ring */
    uint32_t now_s;       /* a coarse clock, seconds, for aging */
    uint32_t learn_limit; /* the source port's learn-limit knob */
};

/* A configuration argument: --arg key=value. Strings are valid during create() only. */
struct vale_arg {
    const char *key;
    const char *value;
};

/* A counter the module exports, shown by `vale-ctl lookup`. */
struct vale_counter {
    char name[32]; /* NUL-terminated */
    uint64_t value;
};

struct vale_lookup_module {
    uint32_t abi_version; /* VALE_LOOKUP_ABI_VERSION */
    uint32_t reserved;    /* 0 */
    const char *name;     /* a short name, as `vale-ctl lookup` shows it */
    /* Makes an instance from its arguments. On error returns NULL and writes why (a
     * NUL-terminated message) into err, of errlen bytes. Required. */
    void *(*create)(const struct vale_arg *args, uint32_t nargs, char *err, size_t errlen);
    /* Frees an instance. Required. */
    void (*destroy)(void *state);
    /* Fills dst of every frame of the batch. Returns how many source addresses it declined
     * to learn (counted against the source port, as the learning bridge's are); 0 if it
     * does not learn. Required. */
    uint64_t (*lookup)(void *state, struct vale_batch *batch);
    /* Port `port`, named name ("valeX:Y"), is on the switch (attached, or there when the
     * module was installed; it may come again for a known port). Optional (NULL). */
    void (*port_added)(void *state, uint16_t port, const char *name);
    /* Port `port` left the switch. Optional. */
    void (*port_removed)(void *state, uint16_t port);
    /* Writes up to max counters; returns how many it wrote. Optional. */
    uint32_t (*counters)(void *state, struct vale_counter *out, uint32_t max);

    /* Version 3 and later. */

    /* The module's own command `op` (a NUL-terminated name) with body_len bytes of `body`
     * (text, followed by a NUL that is not counted), as `vale-ctl module valeX OP BODY`
     * sends them: valed reads neither. Writes its answer (text, UTF-8, no NUL needed) into
     * out, at most out_cap (VALE_CONTROL_OUT_CAP) bytes, and its length into *out_len.
     * Returns 0, or an errno: EOPNOTSUPP (no such command), EINVAL (a bad body), ENOENT
     * (what it names is not there), ERANGE (the answer would not fit out_cap), any other
     * (it failed); with an errno, out may hold the reason (*out_len bytes). An *out_len past
     * out_cap, or an answer that is not UTF-8, is refused by valed as the module's error.
     * Optional: NULL, the module takes no commands. */
    int (*control)(void *state, const char *op, const char *body, size_t body_len, char *out,
                   size_t out_cap, size_t *out_len);
    /* The commands anyone may send (reading ones), a NULL-terminated array of names; the
     * others are an administrator's. NULL: every command is an administrator's. */
    const char *const *open_ops;
};

/* The one symbol valed looks for. */
const struct vale_lookup_module *vale_lookup_module(void);

#ifdef __cplusplus
}
#endif

#endif /* VALE_LOOKUP_H */
