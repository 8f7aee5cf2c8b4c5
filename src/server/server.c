/* server.c - the HTTP plumbing of `cairn serve`: libmicrohttpd, bodies, auth, streamed responses,
 * disconnects. See server.h.
 *
 * A connection is in the peers table (peers.h) from its start to its close: while it waits for a
 * request's headers, the header deadline runs (a client that sends nothing, or a byte a second,
 * is shut out; so is an idle keep-alive connection). A request on it goes through:
 *     HEADERS  [access handler, first call]  the deadline stops; auth (401) and a declared body
 *              past the limit (413) are answered before the body is read
 *     BODY     [further calls]   bytes accumulate up to max_body; a chunked body that passes it
 *                                closes the connection at once (libmicrohttpd cannot queue an
 *                                answer mid-body, and reading the rest would be the attack)
 *     ROUTE    [last call]       routes.c answers at once or queues a job; a job's response is
 *                                queued with a content reader, so headers go out immediately
 *     STREAM   [content reader]  drains the job's channel; between bytes it checks every 100 ms
 *                                whether the peer closed its socket (that is the cancellation),
 *                                and sends the dialect's idle bytes after keepalive_s of silence
 *     DONE     [response freed]  the job is abandoned if it was not read to its end; the
 *                                deadline starts again for the connection's next request
 * The connection's thread may block in the content reader: libmicrohttpd runs one thread per
 * connection here, so blocking one stream never stalls another.
 */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/log.h"
#include "server/api.h"
#include "server/server_impl.h"

/* Per-request state between the access handler's calls. */
typedef struct conn {
    char *body;
    size_t len, cap;
} conn;

/* The peers-table entry of connection c (NULL if it has none: cn_peers_add ran out of memory). */
static cn_peer *peer_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    cn_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? cn_peers_add(&s->peers, ci->connect_fd) : NULL;
    } else { /* CLOSED: libmicrohttpd closes the socket after this returns (peers.h (2)) */
        cn_peers_remove(&s->peers, *socket_context);
        *socket_context = NULL;
    }
}

/* The content reader's state: one per streamed job. */
typedef struct stream {
    cn_job *job;
    int fd;
    const char *idle;
    double idle_ms;
    double last; /* monotonic ms of the last bytes handed to MHD */
} stream;

static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p.revents & POLLIN) { /* readable: EOF, or a pipelined request (not gone) */
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return 0;
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    for (;;) {
        long n = cn_chan_read(&st->job->chan, buf, max, 100);
        double now = cn_now_ms();
        if (n > 0) {
            st->last = now;
            return n;
        }
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (peer_gone(st->fd)) {
            cn_log(CN_LOG_INFO, "request %s: client disconnected", st->job->id);
            cn_job_abandon(st->job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        size_t il = strlen(st->idle);
        if (now - st->last >= st->idle_ms && il <= max) {
            memcpy(buf, st->idle, il);
            st->last = now;
            return (ssize_t)il;
        }
    }
}

static void reader_free(void *cls) {
    stream *st = cls;
    cn_job_state js = cn_job_get_state(st->job);
    if (js != CN_JOB_DONE && js != CN_JOB_CANCELED && cn_job_gone_at(st->job) == 0)
        cn_log(CN_LOG_INFO, "request %s: client disconnected", st->job->id);
    cn_job_abandon(st->job); /* no-op for a job read to its end; cancels one that was not */
    cn_job_unref(st->job);
    free(st);
}

#define ALLOWED "GET, HEAD, POST, OPTIONS" /* every route's methods, for 204 and 405 */

static enum MHD_Result send_json(struct MHD_Connection *c, int status, cJSON *body,
                                 int retry_after) {
    struct MHD_Response *r;
    if (status == 204) { /* no content: OPTIONS */
        cJSON_Delete(body);
        r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, ALLOWED);
        enum MHD_Result ret = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        return ret;
    }
    char *s = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    if (!s) s = strdup("{\"error\":\"out of memory\"}");
    if (!s) return MHD_NO;
    size_t n = strlen(s);
    s[n] = '\n'; /* replace the NUL: a trailing newline, as Ollama's bodies end */
    /* The response owns s from here. A HEAD request gets the same headers (Content-Length too)
     * and no body: libmicrohttpd leaves the body out itself. */
    r = MHD_create_response_from_buffer(n + 1, s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, ALLOWED);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json; charset=utf-8");
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, const char *url, int status,
                                  const char *msg) {
    return send_json(c, status, cn_route_error(url, status, msg, NULL, NULL), 0);
}

static enum MHD_Result send_job(cn_server *s, struct MHD_Connection *c, cn_job *j) {
    stream *st = calloc(1, sizeof *st);
    if (!st) {
        cn_job_abandon(j);
        cn_job_unref(j);
        return MHD_NO;
    }
    st->job = j;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    st->fd = ci ? ci->connect_fd : -1;
    const cn_api_ops *ops = cn_api_ops_for(j->api);
    st->idle = j->stream ? ops->idle : " "; /* JSON allows whitespace before the value */
    st->idle_ms = s->o.keepalive_s * 1e3;
    st->last = cn_now_ms();
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, reader, st, reader_free);
    if (!r) {
        reader_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            j->stream ? ops->stream_type : "application/json; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no"); /* proxies: do not hold the stream */
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* Constant-time comparison, so the key cannot be guessed byte by byte from response times. */
static int key_equal(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < nb; i++) d |= (unsigned char)(a[i % (na ? na : 1)] ^ b[i]);
    return d == 0 && na == nb;
}

/* Authorization: Bearer KEY, or Anthropic's x-api-key: KEY. */
static int authorized(cn_server *s, struct MHD_Connection *c, const char *url) {
    if (!s->o.api_key || !strcmp(url, "/")) return 1;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (x && key_equal(x, s->o.api_key)) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return key_equal(h, s->o.api_key);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    cn_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) { /* HEADERS */
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        cn_peers_busy(&s->peers, peer_of(c), 1);
        if (!authorized(s, c, url)) {
            int sent = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION) ||
                       MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
            return send_error(c, url, 401, sent ? "invalid API key"
                                                : "missing API key: send Authorization: Bearer KEY "
                                                  "(or x-api-key: KEY)");
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) {
            char msg[128];
            snprintf(msg, sizeof msg, "request body over the limit of %zu bytes", s->o.max_body);
            return send_error(c, url, 413, msg);
        }
        return MHD_YES;
    }
    if (*upload_size) { /* BODY */
        size_t n = *upload_size;
        *upload_size = 0;
        if (cn->len + n > s->o.max_body) {
            cn_log(CN_LOG_INFO, "%s %s: body over the limit of %zu bytes: connection closed", method,
                   url, s->o.max_body);
            return MHD_NO;
        }
        if (cn->len + n + 1 > cn->cap) {
            size_t cap = cn->cap ? cn->cap : 4096;
            while (cap < cn->len + n + 1) cap *= 2;
            char *nb = realloc(cn->body, cap);
            if (!nb) return MHD_NO;
            cn->body = nb;
            cn->cap = cap;
        }
        memcpy(cn->body + cn->len, upload, n);
        cn->len += n;
        cn->body[cn->len] = '\0';
        return MHD_YES;
    }
    /* ROUTE */
    cn_route_answer a;
    cn_route(s, method, url, cn->body ? cn->body : "", cn->len, &a);
    if (a.job) return send_job(s, c, a.job);
    return send_json(c, a.status, a.body, a.retry_after);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    cn_server *s = cls;
    (void)toe;
    cn_peers_busy(&s->peers, peer_of(c), 0);
    conn *cn = *con_cls;
    if (!cn) return;
    free(cn->body);
    free(cn);
    *con_cls = NULL;
}

int cn_server_open(cn_server **out, const cn_server_opts *o, cn_engine *e, const cn_text *t,
                   const cn_model_card *card, cn_err *err) {
    *out = NULL;
    cn_server *s = calloc(1, sizeof *s);
    if (!s) return cn_err_set(err, CN_ENOMEM, "out of memory");
    s->o = *o;
    if (!s->o.host) s->o.host = "127.0.0.1";
    if (!s->o.max_body) s->o.max_body = 32u << 20;
    if (s->o.max_queue <= 0) s->o.max_queue = 64;
    if (s->o.finish_cancelled_s < 0) s->o.finish_cancelled_s = 120;
    if (s->o.keepalive_s <= 0) s->o.keepalive_s = 5;
    if (s->o.header_timeout_s <= 0) s->o.header_timeout_s = 30;
    s->card = *card;
    s->env.model_name = card->name;
    s->env.aliases = o->aliases, s->env.n_aliases = o->n_aliases;
    s->env.text = t;
    s->env.ctx = card->ctx;
    s->env.canned = o->test_canned_output;
    s->env.canned_after_tool = o->test_canned_after_tool;
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, s->o.host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)s->o.port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, s->o.host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)s->o.port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else if (!strcmp(s->o.host, "localhost")) {
        a4.sin_family = AF_INET;
        a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a4.sin_port = htons((uint16_t)s->o.port);
        sa = (struct sockaddr *)&a4;
    } else {
        free(s);
        return cn_err_set(err, CN_EINVAL, "--host %s: give a numeric IPv4 or IPv6 address", o->host);
    }
    int rc = cn_peers_start(&s->peers, s->o.header_timeout_s);
    if (rc) {
        free(s);
        return cn_err_set(err, rc, "cannot start the connection table: %s", cn_strerror(rc));
    }
    rc = cn_worker_start(&s->worker, e, s->o.max_queue, s->o.finish_cancelled_s);
    if (rc) {
        cn_peers_stop(&s->peers);
        free(s);
        return cn_err_set(err, rc, "cannot start the engine worker: %s", cn_strerror(rc));
    }
    s->d = MHD_start_daemon(flags, (uint16_t)s->o.port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, sa,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->o.max_queue + 64),
                            MHD_OPTION_END);
    if (!s->d) {
        int e_ = errno;
        cn_worker_stop(&s->worker);
        cn_peers_stop(&s->peers);
        free(s);
        return cn_err_set(err, CN_EIO, "cannot listen on %s:%d: %s", o->host, o->port,
                          e_ ? strerror(e_) : "libmicrohttpd refused");
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->o.port;
    *out = s;
    return CN_OK;
}

int cn_server_port(const cn_server *s) { return s->port; }

void cn_server_close(cn_server *s) {
    if (!s) return;
    MHD_quiesce_daemon(s->d);    /* no new connections */
    cn_worker_stop(&s->worker);  /* every job ends; every channel closes */
    MHD_stop_daemon(s->d);       /* joins the connection threads, now unblocked */
    cn_peers_stop(&s->peers);    /* every connection closed: the table is empty */
    free(s);
}
