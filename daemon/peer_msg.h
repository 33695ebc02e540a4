/* The daemons' peer protocol, parsed: one JSON line of a link (link.c) becomes a typed message,
 * or is refused with a reason that names the offending field. Pure: no I/O, no daemon state;
 * what a message means for a link or a job is link.c's and remote.c's business.
 *
 * Handshake (auth.h has the HMAC and the versions), expected by the link's state, no "t":
 *   HELLO     dialer   -> {"hello": node, "nonce": hex32[, "v": 2, "caps": [cap, ...]]}
 *   CHALLENGE listener -> {"node": node, "nonce": hex32, "mac": hex32[, "v": 2, "chosen": cap]}
 *   PROOF     dialer   -> {"mac": hex32}
 *   OK        listener -> {"ok": true, "node": node}       (version 1 only)
 *   REFUSED   listener -> {"error": text}                 (accepted wherever a handshake
 *                                                           message is expected)
 *   "v" absent is version 1 (an older ddpd). Capabilities are words of at most 15 bytes.
 * Authenticated, told apart by "t":
 *   STATUS    {"t":"status", "node", "slots", "free"}     a node's slots (listener -> dialer)
 *   START     {"t":"start", "job", "name", "ranks":[..], "world", "rdzv", "token", "spec",
 *              "cwd", "uid", "gid", "threads", "elastic", "max_restarts"[, "groups":[..]]}
 *                                                                          coordinator -> node
 *   KILL      {"t":"kill", "job", "pid", "host_id"}       coordinator -> node
 *   SIGNAL    {"t":"signal", "job", "sig"}                coordinator -> node
 *   STARTED   {"t":"started", "job", "n"}                 node -> coordinator
 *   FAILED    {"t":"failed", "job", "why"}                node -> coordinator
 *   ADOPTED   {"t":"adopted", "job", "ranks":[..]}        node -> coordinator
 *   EXIT      {"t":"exit", "job", "rank", "code", "sig"}  node -> coordinator
 *   PING      {"t":"ping"}                                either way, on a quiet v2 link
 * Every field a sender writes is required (but START's "groups", which older senders lack),
 * with its JSON type, its range and, for strings, its length (the limits below); node names
 * must be valid job names (ddp_spec_name_ok: they become directory names and log words);
 * fields this version does not read are allowed (a newer sender may add some), duplicate keys
 * and bytes after the object are not. An authenticated message whose "t" this version does not
 * know parses as UNKNOWN, so that a newer peer is not cut off.
 * Thread-safe (no shared state).
 */
#ifndef DDPD_PEER_MSG_H
#define DDPD_PEER_MSG_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/auth.h"

#define DDPD_PMSG_NODE_MAX 63       /* node names: what cfg.node_name holds */
#define DDPD_PMSG_TOKEN_MAX 127     /* job tokens: what the rendezvous hello holds */
#define DDPD_PMSG_ADDR_MAX 255      /* rendezvous host:port */
#define DDPD_PMSG_HOST_ID_MAX 159   /* ddp_host_id()'s boot id + hostname */
#define DDPD_PMSG_TEXT_MAX 4095     /* job names, working directories, failure reasons */
#define DDPD_PMSG_MAX_RANKS 4096    /* ranks one node runs of one job */
#define DDPD_PMSG_MAX_WORLD (1 << 20) /* as DDP_WORLD_SIZE allows */
#define DDPD_PMSG_MAX_SLOTS (1 << 20)

typedef enum {
    DDPD_PMSG_ANY = 0, /* as `expect`: an authenticated message, told apart by "t" */
    DDPD_PMSG_HELLO,
    DDPD_PMSG_CHALLENGE,
    DDPD_PMSG_PROOF,
    DDPD_PMSG_OK,
    DDPD_PMSG_REFUSED,
    DDPD_PMSG_STATUS,
    DDPD_PMSG_START,
    DDPD_PMSG_KILL,
    DDPD_PMSG_SIGNAL,
    DDPD_PMSG_STARTED,
    DDPD_PMSG_FAILED,
    DDPD_PMSG_ADOPTED,
    DDPD_PMSG_EXIT,
    DDPD_PMSG_PING,
    DDPD_PMSG_UNKNOWN,
} ddpd_pmsg_kind_t;

#define DDPD_PMSG_CAP_MAX 15 /* a capability's longest name */
#define DDPD_PMSG_CAPS_MAX 8 /* capabilities a hello may list */

/* A coordinator's request to start ranks of its job here. Strings are borrowed from the
 * message's root; ranks are owned by the message (ddpd_pmsg_close frees them). */
typedef struct ddpd_pmsg_start {
    int64_t job;
    const char *name, *rdzv, *token, *spec, *cwd;
    int *ranks; /* n_ranks global ranks, each in [0, world) */
    int n_ranks; /* [1, DDPD_PMSG_MAX_RANKS], at most world */
    int world;
    int threads, max_restarts;
    uint32_t uid, gid; /* sent as C ints: a uid over INT_MAX arrives negative */
    int elastic;
    uint32_t *groups; /* optional "groups" (owned; NULL when absent: an older coordinator) */
    int n_groups, has_groups;
} ddpd_pmsg_start_t;

typedef struct ddpd_pmsg {
    ddpd_pmsg_kind_t kind;
    json_t *root; /* the parsed object: owns every string below */
    union {
        struct {
            const char *node;
            unsigned char nonce[DDPD_AUTH_NONCEBYTES];
            int v;       /* 1 when absent */
            char caps[DDPD_PMSG_CAPS_MAX * (DDPD_PMSG_CAP_MAX + 1)]; /* "a,b" ("" when none) */
        } hello;
        struct {
            const char *node;
            unsigned char nonce[DDPD_AUTH_NONCEBYTES];
            const char *mac; /* 2 * DDPD_AUTH_MACBYTES hex digits */
            int v;              /* 1 when absent */
            const char *chosen; /* "" when absent */
        } challenge;
        struct {
            const char *mac; /* 2 * DDPD_AUTH_MACBYTES hex digits */
        } proof;
        struct {
            const char *node;
        } ok;
        struct {
            const char *error;
        } refused;
        struct {
            const char *node;
            int slots, free; /* free in [0, slots] */
        } status;
        ddpd_pmsg_start_t start;
        struct {
            int64_t job;
            int pid;             /* 0: unknown (matches no process) */
            const char *host_id; /* "" when the coordinator does not know it */
        } kill;
        struct {
            int64_t job;
            int sig;
        } signal;
        struct {
            int64_t job;
            int n;
        } started;
        struct {
            int64_t job;
            const char *why;
        } failed;
        struct {
            int64_t job;
            int *ranks; /* owned; NULL when n_ranks is 0 */
            int n_ranks;
        } adopted;
        struct {
            int64_t job;
            int rank, code, sig;
        } exit;
        struct {
            const char *t;
        } unknown;
    } u;
} ddpd_pmsg_t;

/* Parses one line (len bytes, no newline needed) as the message expected: a handshake kind
 * (HELLO, CHALLENGE, PROOF or OK; a REFUSED is accepted too, so the caller checks m->kind) or
 * DDPD_PMSG_ANY for an authenticated one. Returns 0 with *m filled (the caller closes it), or
 * DDP_EPROTO with *m empty and why (why_len bytes, NUL-terminated) saying what is wrong, e.g.
 * "start: field 'world': 0 is out of range [1, 1048576]". */
int ddpd_pmsg_parse(const char *line, size_t len, ddpd_pmsg_kind_t expect, ddpd_pmsg_t *m,
                    char *why, size_t why_len);
/* The same for an object already parsed (a start request kept in guest.json); takes ownership
 * of o (a new reference), also on failure. */
int ddpd_pmsg_from_json(json_t *o, ddpd_pmsg_kind_t expect, ddpd_pmsg_t *m, char *why,
                        size_t why_len);
/* Releases what m owns and empties it; NULL-safe, and safe on an empty or closed message. */
void ddpd_pmsg_close(ddpd_pmsg_t *m);
/* The kind's name as the protocol says it ("start", "hello", ...). */
const char *ddpd_pmsg_kind_name(ddpd_pmsg_kind_t k);

#endif
