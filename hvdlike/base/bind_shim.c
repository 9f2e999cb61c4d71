/* hvdlike's bind shim, preloaded into ranks by hvdlikerun (LD_PRELOAD).
 *
 * TensorFlow's gRPC server listens on the wildcard address of its port ("0.0.0.0:PORT", as
 * a dual-stack "[::]:PORT" socket) and offers no bind address.  When the environment holds
 * HVDLIKE_TF_BIND=PORT=IP (export_tf_config sets it to the address the rank publishes in
 * TF_CONFIG), a bind() of the wildcard address on PORT binds to IP instead: an IPv6 socket
 * gets IP's IPv4-mapped form, so the server listens on that one address only.  Every other
 * bind() -- other ports, explicit addresses, no variable set -- is passed through unchanged.
 *
 * HVDLIKE_BIND_LOOPBACK=1 (hvdlikerun sets it in a job on one machine) turns every bind of
 * a wildcard address into one of the loopback address (127.0.0.1, ::1) in the MPI's launcher
 * (a program named in LAUNCHERS): Open MPI's prterun would listen on every interface for its
 * out-of-band channel, and has no setting for its bind address.  The ranks, which inherit
 * the variable, are other programs: their binds pass through.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_function)(int, const struct sockaddr *, socklen_t);

/* Looked up by hvdlike (ctypes) to tell whether this shim is loaded. */
int hvdlike_bind_shim_loaded = 1;

static const char *const LAUNCHERS[] = {"prterun", "prte", "prted", "mpirun", "mpiexec",
                                        "orterun", "orted", NULL};
static int loopback_only;  /* a launcher, loaded with HVDLIKE_BIND_LOOPBACK=1 */

__attribute__((constructor)) static void read_loopback_setting(void) {
    const char *value = getenv("HVDLIKE_BIND_LOOPBACK");
    if (!value || strcmp(value, "1") != 0)
        return;
    for (const char *const *name = LAUNCHERS; *name; name++)
        if (strcmp(program_invocation_short_name, *name) == 0)
            loopback_only = 1;
}

static bind_function next_bind(void) {
    static bind_function real;
    if (!real)
        real = (bind_function)dlsym(RTLD_NEXT, "bind");
    return real;
}

/* ``addr`` with a wildcard address replaced by the loopback one (into ``copy``), or NULL. */
static const struct sockaddr *on_loopback(const struct sockaddr *addr, socklen_t len,
                                          struct sockaddr_storage *copy) {
    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in *a = (struct sockaddr_in *)copy;
        *a = *(const struct sockaddr_in *)addr;
        if (a->sin_addr.s_addr != htonl(INADDR_ANY))
            return NULL;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return (const struct sockaddr *)a;
    }
    if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)copy;
        *a = *(const struct sockaddr_in6 *)addr;
        if (!IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr))
            return NULL;
        a->sin6_addr = in6addr_loopback;
        return (const struct sockaddr *)a;
    }
    return NULL;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    if (loopback_only && addr) {
        struct sockaddr_storage copy;
        const struct sockaddr *local = on_loopback(addr, len, &copy);
        if (local)
            return next_bind()(fd, local, len);
    }
    const char *spec = getenv("HVDLIKE_TF_BIND");
    const char *ip_text = spec ? strchr(spec, '=') : NULL;
    if (!ip_text || !addr)
        return next_bind()(fd, addr, len);
    char *end;
    long port = strtol(spec, &end, 10);
    if (end != ip_text)
        return next_bind()(fd, addr, len);
    ip_text++;
    struct in_addr ip4;
    struct in6_addr ip6;
    int is4 = inet_pton(AF_INET, ip_text, &ip4) == 1;
    int is6 = !is4 && inet_pton(AF_INET6, ip_text, &ip6) == 1;

    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in a = *(const struct sockaddr_in *)addr;
        if (a.sin_addr.s_addr != htonl(INADDR_ANY) || ntohs(a.sin_port) != port)
            return next_bind()(fd, addr, len);
        if (!is4) {  /* an IPv6 address was asked for: no IPv4 wildcard on this port */
            errno = EADDRNOTAVAIL;
            return -1;
        }
        a.sin_addr = ip4;
        return next_bind()(fd, (const struct sockaddr *)&a, sizeof a);
    }
    if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a = *(const struct sockaddr_in6 *)addr;
        if (!IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) || ntohs(a.sin6_port) != port)
            return next_bind()(fd, addr, len);
        if (is6) {
            a.sin6_addr = ip6;
        } else if (is4) {  /* ::ffff:a.b.c.d, the IPv4 address on a dual-stack socket */
            memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
            a.sin6_addr.s6_addr[10] = 0xff;
            a.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&a.sin6_addr.s6_addr[12], &ip4, sizeof ip4);
        } else {
            return next_bind()(fd, addr, len);
        }
        return next_bind()(fd, (const struct sockaddr *)&a, sizeof a);
    }
    return next_bind()(fd, addr, len);
}
