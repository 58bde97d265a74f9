"""Whether a client of our own service takes its proxy from the environment.

httpx2 sends every request through `HTTP_PROXY` (or `HTTPS_PROXY`, `ALL_PROXY`) unless
`NO_PROXY` names the host, and it exempts no address of its own accord, loopback included.
A desktop with a corporate proxy in its environment would then send `chatqna ask` and
`chatqna bench --service` to the proxy, which cannot reach the service on the user's own
loopback, and the error would blame the service. So those clients read nothing from the
environment (`trust_env=False`) when the service is on loopback. The upstream clients
keep httpx2's documented rules, loopback upstreams too (`chatqna.upstream.client`).
"""

from __future__ import annotations

import ipaddress

import httpx2


def is_loopback(host: str) -> bool:
    """`localhost`, or an address in 127.0.0.0/8 or `::1` (IPv4-mapped too)."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def trust_env_for(url: str) -> bool:
    """httpx2's `trust_env` for a client of our own service at `url`: False on a loopback
    host, which no proxy could reach. (That also leaves out `SSL_CERT_FILE`, `SSL_CERT_DIR`
    and `.netrc`; the service serves plain HTTP and `ask` sends no credentials.)"""
    try:
        host = httpx2.URL(url).host
    except httpx2.InvalidURL:
        return True  # the request itself will say what is wrong with the URL
    return not is_loopback(host)
