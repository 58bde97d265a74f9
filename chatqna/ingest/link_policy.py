"""Which addresses `link_list` may fetch from, and a connection that honours it.

By default the service refuses loopback, private, link-local, cloud metadata and other
non-public addresses: a URL handed to dataprep must not turn the service into a way to
read its own network. `CHATQNA_DATAPREP_LINK_ALLOWLIST` opens named hosts (matched on the
URL's host name) and networks (matched on the resolved address).

A name is checked after it is resolved, and every address it resolves to must pass. To
leave no gap between the check and the connection (DNS rebinding: a name that resolves to
a public address for the check and to a private one for the connection), direct
connections go through `PinnedBackend`, which resolves the name itself, checks each
address again and connects only to an address it has checked; `PinnedTransport` is the
httpx2 transport over an httpcore2 pool that connects through it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

import httpcore2
import httpx2

from chatqna.errors import LinkRefused, LinkUnreadable

__all__ = ["LinkPolicy", "PinnedBackend", "PinnedTransport", "Resolver", "system_resolver"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> the addresses the host resolves to.
Resolver = Callable[[str, int], Awaitable[list[str]]]

# Instance metadata services: AWS, GCP, Azure, OpenStack (169.254.169.254), AWS over IPv6,
# Alibaba Cloud, Oracle Cloud.
_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses from the operating system's resolver (without blocking)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# NAT64: the well-known prefix carries an IPv4 address in its low 32 bits (RFC 6052); the
# local-use prefix (RFC 8215) embeds it where each network chooses, so it is refused whole
# (in `_SPECIAL_PURPOSE`).
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# IPv4-translated addresses (`::ffff:0:a.b.c.d`, SIIT, RFC 2765).
_IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
# IPv4-compatible addresses (`::a.b.c.d`, deprecated), except `::` and `::1`.
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
# The only IPv6 space allocated for global unicast (IANA's IPv6 address space registry):
# the rest is multicast, link-local, unique-local, or reserved by the IETF.
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")

# The entries of IANA's IPv4 and IPv6 special-purpose address registries that are not
# globally reachable (loopback, link-local and the unspecified address are checked apart,
# and the IPv4-mapped and translated prefixes are judged by the IPv4 address they carry).
# Listed here rather than taken from `ipaddress.is_global` or `is_private`, whose tables
# differ between CPython releases, patch releases included. A block is refused whole, the
# few anycast addresses the registry marks reachable inside it (192.0.0.9, 2001:1::1...)
# too. A range Python's `ipaddress` has called private keeps that reason.
_SPECIAL_PURPOSE: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(network), reason)
    for reason, networks in (
        (
            "private_address",
            (
                "0.0.0.0/8",  # "this network"
                "10.0.0.0/8",  # private use
                "172.16.0.0/12",
                "192.168.0.0/16",
                "192.0.0.0/24",  # IETF protocol assignments (192.0.0.8, the dummy address...)
                "192.0.2.0/24",  # documentation
                "198.51.100.0/24",
                "203.0.113.0/24",
                "198.18.0.0/15",  # benchmarking
                "240.0.0.0/4",  # reserved
                "255.255.255.255/32",  # limited broadcast
                "100::/64",  # discard-only
                "2001::/23",  # IETF protocol assignments (Teredo, benchmarking, ORCHID...)
                "2001:db8::/32",  # documentation
                "fc00::/7",  # unique local
            ),
        ),
        (
            "reserved_address",
            (
                "100.64.0.0/10",  # shared address space (carrier-grade NAT)
                "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation
                "100:0:0:1::/64",  # dummy prefix
                "3fff::/20",  # documentation
                "5f00::/16",  # segment routing SIDs
            ),
        ),
    )
    for network in networks
)


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: IPv4-mapped, IPv4-translated, NAT64
    (well-known prefix), 6to4 or IPv4-compatible; None when it carries none."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if (
        address in _NAT64
        or address in _IPV4_TRANSLATED
        or (address in _IPV4_COMPATIBLE and int(address) > 1)
    ):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _why_refused(address: Address) -> str | None:
    if isinstance(address, ipaddress.IPv6Address):
        address = embedded_ipv4(address) or address
    if address in _METADATA:
        return "metadata_address"
    # Fixed ranges, the same in every Python.
    checks = (
        ("loopback_address", address.is_loopback),
        ("unspecified_address", address.is_unspecified),
        ("link_local_address", address.is_link_local),
        ("multicast_address", address.is_multicast),
    )
    for reason, hit in checks:
        if hit:
            return reason
    for network, reason in _SPECIAL_PURPOSE:
        if address in network:
            return reason
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST:
        return "reserved_address"
    return None


@dataclass(frozen=True)
class LinkPolicy:
    """The allow-list, and the check every resolved address of every hop goes through."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = field(default_factory=tuple)

    @classmethod
    def from_entries(cls, entries: Iterable[str]) -> LinkPolicy:
        """Entries are host names or IP addresses/networks (`10.1.0.0/16`)."""
        hosts: set[str] = set()
        networks: list[Network] = []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def host_allowed(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def refusal(self, host: str, address: str) -> str | None:
        """Why `address` (one that `host` resolved to) may not be fetched, or None."""
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
        if self.host_allowed(host) or any(parsed in network for network in self.networks):
            return None
        return _why_refused(parsed)

    def check(self, url: str, host: str, addresses: Sequence[str]) -> None:
        """Raise `LinkRefused` unless every address of `host` may be fetched."""
        for address in addresses:
            reason = self.refusal(host, address)
            if reason is not None:
                raise LinkRefused(
                    f"{url}: {host} resolves to {address}, a {reason.replace('_', ' ')}; "
                    "links to such addresses are refused unless "
                    "CHATQNA_DATAPREP_LINK_ALLOWLIST names the host or network",
                    reason=reason,
                    details={"url": url, "host": host, "address": address},
                )


async def resolve_checked(
    policy: LinkPolicy, resolver: Resolver, url: str, host: str, port: int
) -> list[str]:
    """`host`'s addresses, after the policy accepted every one of them."""
    try:
        ipaddress.ip_address(host)
        addresses = [host]
    except ValueError:
        try:
            # The system resolver encodes the name with the IDNA codec first: an empty label
            # or one over 63 characters is a UnicodeError there, not a failed look-up.
            host.encode("idna")
        except UnicodeError as exc:
            raise LinkRefused(
                f"{url}: {host!r} is not a valid host name ({exc})",
                reason="bad_url",
                details={"url": url, "host": host},
            ) from exc
        try:
            addresses = await resolver(host, port)
        except OSError as exc:
            raise LinkUnreadable(
                f"{url}: cannot resolve {host}: {exc}",
                reason="dns_error",
                details={"url": url, "host": host},
            ) from exc
    if not addresses:
        raise LinkUnreadable(
            f"{url}: {host} has no address", reason="dns_error", details={"url": url}
        )
    policy.check(url, host, addresses)
    return addresses


class PinnedBackend(httpcore2.AsyncNetworkBackend):
    """A network backend that connects only to addresses the policy has just accepted.

    httpcore2 hands it the host name; it resolves the name once, checks every address, and
    opens the TCP connection to one of those same addresses (TLS still verifies the
    certificate against the host name, which httpcore2 passes on separately).
    """

    def __init__(self, policy: LinkPolicy, resolver: Resolver) -> None:
        self._policy = policy
        self._resolver = resolver
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's signature)
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        addresses = await resolve_checked(
            self._policy, self._resolver, f"//{host}:{port}", host, port
        )
        failure: httpcore2.ConnectError | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except httpcore2.ConnectError as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's signature)
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("links are fetched over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


_HTTPCORE_ERRORS = (
    httpcore2.TimeoutException,
    httpcore2.NetworkError,
    httpcore2.ProtocolError,
    httpcore2.UnsupportedProtocol,
    httpcore2.ProxyError,
)


def _translate(exc: Exception, request: httpx2.Request) -> httpx2.TransportError:
    if isinstance(exc, httpcore2.TimeoutException):
        return httpx2.TimeoutException(str(exc), request=request)
    return httpx2.TransportError(f"{type(exc).__name__}: {exc}")


class _BodyStream(httpx2.AsyncByteStream):
    def __init__(self, stream: AsyncIterable[bytes], request: httpx2.Request) -> None:
        self._stream = stream
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except _HTTPCORE_ERRORS as exc:
            raise _translate(exc, self._request) from exc

    async def aclose(self) -> None:
        closer = getattr(self._stream, "aclose", None)
        if closer is not None:
            await closer()


class PinnedTransport(httpx2.AsyncBaseTransport):
    """httpx2's transport contract over an httpcore2 pool that connects through a
    `PinnedBackend` (httpx2's own transport takes no network backend). Proxied requests
    do not come here: httpx2 routes them to its proxy transports."""

    def __init__(self, backend: PinnedBackend) -> None:
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=True), network_backend=backend
        )

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        assert isinstance(request.stream, httpx2.AsyncByteStream)
        core_request = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = await self._pool.handle_async_request(core_request)
        except _HTTPCORE_ERRORS as exc:
            raise _translate(exc, request) from exc
        assert isinstance(response.stream, AsyncIterable)
        return httpx2.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_BodyStream(response.stream, request),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
