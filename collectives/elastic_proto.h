/* The elastic rendezvous protocol: what a worker (collectives/bootstrap_elastic.c) and the job's
 * coordinator (daemon/coord.c) say to each other. One JSON object per line over one TCP
 * connection that stays open for the worker's life; the coordinator forms *generations* from
 * the workers connected to it.
 *
 * worker -> coordinator
 *   {"t":"join","token":T,"pid":P,"host_id":H,"hint":R,"step":S,"sgen":Q}
 *        wants a place in the next generation. S: optimizer steps completed in this process's
 *        memory, -1 when it holds no state yet (a fresh process). Q: the generation its state
 *        is from, the last one it was given (0: none, or a worker older than the field); two
 *        states at the same step are the same state only from the same generation (a rank
 *        late for a generation that redid its step holds another one). R: the launcher's rank,
 *        used only to order the first generation. Sent on arrival and again after every
 *        generation ends (a failure, or a regroup at a step boundary).
 *   {"t":"hb","step":S}          heartbeat, every DDP_ELASTIC_HB_MS from a thread of its own
 *   {"t":"ag","gen":G,"data":X}  this member's contribution to an allgather of generation G
 *                                (X: lowercase hex); allgathers of a generation run in order
 *   {"t":"done","step":S}        trained to the end; leaves without a regroup
 *   {"t":"flight","dump":D}      this worker's flight recorder dump (collectives/flight.h), sent
 *                                after a collective of its timed out, and in answer to "dump"
 *   {"t":"rejoin","token":T,"pid":P,"host_id":H,"hint":R,"step":S,"gen":G,"rank":K,"size":N}
 *        sent after reconnecting to a coordinator that restarted (its daemon did): this worker
 *        is rank K of N in generation G, still training. A coordinator that is adopting the
 *        running job takes generation G over once all N ranks of it are back.
 *
 * coordinator -> worker
 *   {"t":"gen","gen":G,"rank":R,"size":N,"source":K,"sync":B,"step":S,"receive":V,"why":W,
 *    "hb_timeout_s":H,"reconnect_s":C[,"kept":[P0, P1, ...]]}
 *        generation G is formed: this worker is rank R of N. K: the rank whose state is the
 *        newest (the highest completed step S, then the newest generation Q); B: 1 when some
 *        member's (S, Q) is not K's, so every member takes part in K's state broadcast before
 *        training; V: 1 when this member is one of those (it receives even at step S). W: why it formed. H: the
 *        silence after which either side gives the other up. C ("reconnect_s"): how long a
 *        member redials a connection that closed. P: when every member of G was a member of
 *        G - 1, each rank's rank there (its communicator can be shrunk into G's).
 *   {"t":"hb"}                   the coordinator's heartbeat, every DDP_ELASTIC_HB_MS
 *   {"t":"ag","gen":G,"all":[X0, X1, ...]}   the allgather's result, in rank order
 *   {"t":"reform","gen":G,"why":W}  generation G is over (a member died or stopped
 *                                answering): abort its communicator at once and join again
 *   {"t":"regroup","gen":G,"why":W} a joiner waits: finish the current step, then join again
 *   {"t":"adopted","gen":G}      a restarted coordinator took the running generation G over:
 *                                nothing changes for the member
 *   {"t":"dump","why":W}         send a flight recorder dump now (from the connection's thread):
 *                                another rank's collective timed out, or a member is evicted
 *   {"t":"exit","why":W}         the job cannot go on (below ddp.min_workers for too long, or
 *                                this worker was evicted): stop with W as the reason
 *
 * Anything that carries an older generation than the coordinator's is dropped. A worker that
 * hears nothing from the coordinator for H seconds leaves the job (exit status 1): the side of a
 * partition without the coordinator stops, so there is never a second brain. A connection that
 * closes is a coordinator that went away (its daemon restarting): a member redials it for C
 * seconds while it trains on, then rejoins; it leaves only when C passes. A generation's data
 * plane spans all its members, so a worker cut off from the others cannot train alone meanwhile.
 */
#ifndef DDP_COLLECTIVES_ELASTIC_PROTO_H
#define DDP_COLLECTIVES_ELASTIC_PROTO_H

#define DDP_ELASTIC_HB_MS 250        /* heartbeat period of a worker */
#define DDP_ELASTIC_MAX_LINE 65536   /* longest line either side accepts */

#endif
