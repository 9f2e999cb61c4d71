/* hvdlike's bind shim, preloaded into ranks by hvdlikerun (LD_PRELOAD).
 *
 * TensorFlow's gRPC server listens on the wildcard address of its port ("0.0.0.0:PORT", as
 * a dual-stack "[::]:PORT" socket) and offers no bind address.  When the environment holds
 * HVDLIKE_TF_BIND=PORT=IP (export_tf_config sets it to the address the rank publishes in
 * TF_CONFIG), a bind() of the wildcard address on PORT binds to IP instead: an IPv6 socket
 * gets IP's IPv4-mapped form, so the server listens on that one address only.  Every other
 * bind() -- other ports, explicit addresses, no variable set -- is passed through unchanged.
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

static bind_function next_bind(void) {
    static bind_function real;
    if (!real)
        real = (bind_function)dlsym(RTLD_NEXT, "bind");
    return real;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
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
