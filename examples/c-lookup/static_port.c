/* static_port: a vale lookup module in C.
 *
 * Every frame goes to one port, named by --arg to=valeX:Y; frames from that port are flooded
 * to all the others. A static "uplink" switch: the smallest module that keeps state, takes
 * configuration, is told about ports and exports counters.
 *
 *   cc -shared -fPIC -O2 -I <vale>/crates/vale-switch/include static_port.c -o libstatic_port.so
 *   vale-ctl lookup vale0 ./libstatic_port.so --arg to=vale0:up
 *
 * --arg index=N sends every frame to port index N instead, whether or not such a port exists:
 * valed drops and counts what names no port (bad_dst), which this argument lets one see.
 * --arg ring=R delivers them to the uplink's rx ring R (default: the switch picks).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vale_lookup.h"

struct state {
    char to[80];          /* the uplink's name, or "" with a fixed index */
    _Atomic uint32_t dst; /* the uplink's index, or VALE_DST_DROP while it is not there */
    uint16_t ring;        /* the uplink's rx ring, or VALE_RING_ANY */
    _Atomic uint64_t sent, flooded;
};

static void *create(const struct vale_arg *args, uint32_t nargs, char *err, size_t errlen)
{
    struct state *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    atomic_init(&s->dst, VALE_DST_DROP);
    s->ring = VALE_RING_ANY;
    int have = 0;
    for (uint32_t i = 0; i < nargs; i++) {
        if (strcmp(args[i].key, "to") == 0 && strlen(args[i].value) < sizeof s->to) {
            strcpy(s->to, args[i].value);
            have = 1;
        } else if (strcmp(args[i].key, "index") == 0) {
            char *end;
            unsigned long n = strtoul(args[i].value, &end, 10);
            if (*args[i].value == '\0' || *end != '\0' || n > 0xffff) {
                snprintf(err, errlen, "index must be a number from 0 to 65535, not '%s'",
                         args[i].value);
                free(s);
                return NULL;
            }
            atomic_store(&s->dst, (uint32_t)n);
            have = 1;
        } else if (strcmp(args[i].key, "ring") == 0) {
            char *end;
            unsigned long n = strtoul(args[i].value, &end, 10);
            if (*args[i].value == '\0' || *end != '\0' || n >= VALE_RING_ANY) {
                snprintf(err, errlen, "ring must be a number from 0 to 65534, not '%s'",
                         args[i].value);
                free(s);
                return NULL;
            }
            s->ring = (uint16_t)n;
        } else {
            snprintf(err, errlen, "unknown argument '%s' (known: to, index, ring)", args[i].key);
            free(s);
            return NULL;
        }
    }
    if (!have) {
        snprintf(err, errlen, "say where frames go: --arg to=valeX:Y");
        free(s);
        return NULL;
    }
    return s;
}

static void destroy(void *state) { free(state); }

static uint64_t lookup(void *state, struct vale_batch *b)
{
    struct state *s = state;
    uint32_t dst = atomic_load_explicit(&s->dst, memory_order_relaxed);
    uint64_t flooded = 0;
    for (uint32_t i = 0; i < b->count; i++) {
        if (dst == b->src_port) {
            b->frames[i].dst = VALE_DST_FLOOD;
            flooded++;
        } else {
            b->frames[i].dst = (uint16_t)dst;
            b->frames[i].ring = s->ring;
        }
    }
    atomic_fetch_add_explicit(&s->sent, b->count - flooded, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->flooded, flooded, memory_order_relaxed);
    return 0;
}

static void port_added(void *state, uint16_t port, const char *name)
{
    struct state *s = state;
    if (s->to[0] && strcmp(name, s->to) == 0)
        atomic_store(&s->dst, port);
}

static void port_removed(void *state, uint16_t port)
{
    struct state *s = state;
    uint32_t was = port;
    if (s->to[0])
        atomic_compare_exchange_strong(&s->dst, &was, VALE_DST_DROP);
}

static uint32_t counters(void *state, struct vale_counter *out, uint32_t max)
{
    struct state *s = state;
    if (max < 2)
        return 0;
    snprintf(out[0].name, sizeof out[0].name, "sent");
    out[0].value = atomic_load(&s->sent);
    snprintf(out[1].name, sizeof out[1].name, "flooded");
    out[1].value = atomic_load(&s->flooded);
    return 2;
}

static const struct vale_lookup_module module = {
    .abi_version = VALE_LOOKUP_ABI_VERSION,
    .name = "static_port",
    .create = create,
    .destroy = destroy,
    .lookup = lookup,
    .port_added = port_added,
    .port_removed = port_removed,
    .counters = counters,
};

const struct vale_lookup_module *vale_lookup_module(void) { return &module; }
