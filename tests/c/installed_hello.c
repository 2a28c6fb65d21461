/* The smallest libvale program, built by the package test against the installed vale.h and
 * libvale (pkg-config --cflags --libs libvale): opens two ports of one switch, sends a
 * broadcast frame from the first and receives it on the second. Usage: installed_hello SWITCH */
#include <stdio.h>
#include <string.h>
#include <vale.h>

static struct vale_port *open_port(const char *sw, const char *port)
{
    char name[64];
    snprintf(name, sizeof name, "%s:%s", sw, port);
    struct vale_port *p = vale_open(name, NULL);
    if (!p)
        fprintf(stderr, "vale_open %s: %s\n", name, vale_last_error());
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct vale_port *a = open_port(argv[1], "a"), *b = open_port(argv[1], "b");
    if (!a || !b)
        return 1;
    unsigned char frame[60];
    memset(frame, 0, sizeof frame);
    memset(frame, 0xff, 6);                          /* broadcast */
    memcpy(frame + 6, "\x02\x00\x00\x00\x00\x01", 6); /* locally administered source */
    frame[12] = 0x88, frame[13] = 0xb5;              /* local experimental ethertype */
    memcpy(frame + 14, "installed", 9);

    struct netmap_ring *tx = NETMAP_TXRING(vale_nifp(a), 0);
    struct netmap_slot *s = &tx->slot[tx->cur];
    memcpy(NETMAP_BUF(tx, s->buf_idx), frame, sizeof frame);
    s->len = sizeof frame;
    tx->head = tx->cur = nm_ring_next(tx, tx->cur);
    if (vale_txsync(a, 0) < 0) {
        fprintf(stderr, "vale_txsync: %s\n", vale_last_error());
        return 1;
    }
    struct netmap_ring *rx = NETMAP_RXRING(vale_nifp(b), 0);
    for (int tries = 0; tries < 50 && nm_ring_empty(rx); tries++) {
        vale_poll(b, VALE_POLLIN, 100);
        vale_rxsync(b, 0);
    }
    if (nm_ring_empty(rx)) {
        fprintf(stderr, "no frame arrived on %s:b\n", argv[1]);
        return 1;
    }
    struct netmap_slot *r = &rx->slot[rx->cur];
    if (r->len != sizeof frame || memcmp(NETMAP_BUF(rx, r->buf_idx), frame, sizeof frame)) {
        fprintf(stderr, "a different frame arrived (%u bytes)\n", r->len);
        return 1;
    }
    rx->head = rx->cur = nm_ring_next(rx, rx->cur);
    vale_rxsync(b, 0);
    vale_close(a);
    vale_close(b);
    printf("frame ok\n");
    return 0;
}
