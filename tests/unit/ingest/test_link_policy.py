"""The address policy for `link_list`: what is refused by default and what the allow-list opens."""

from __future__ import annotations

import ipaddress

import pytest

from chatqna.errors import LinkRefused, LinkUnreadable
from chatqna.ingest.link_policy import LinkPolicy, resolve_checked

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback_address"),
        ("127.8.9.10", "loopback_address"),
        ("::1", "loopback_address"),
        ("::ffff:127.0.0.1", "loopback_address"),
        ("0.0.0.0", "unspecified_address"),
        ("10.1.2.3", "private_address"),
        ("172.16.0.1", "private_address"),
        ("192.168.1.1", "private_address"),
        ("fd12:3456::1", "private_address"),
        ("169.254.10.20", "link_local_address"),
        ("fe80::1", "link_local_address"),
        ("169.254.169.254", "metadata_address"),
        ("fd00:ec2::254", "metadata_address"),
        ("100.100.100.200", "metadata_address"),
        ("100.64.0.1", "reserved_address"),
        ("224.0.0.1", "multicast_address"),
        ("93.184.215.14", None),
        ("2606:4700::1111", None),
        # IPv6 forms that reach an IPv4 address are judged by that address.
        ("64:ff9b::a00:1", "private_address"),  # NAT64 to 10.0.0.1
        ("64:ff9b::a9fe:a9fe", "metadata_address"),  # NAT64 to 169.254.169.254
        ("64:ff9b::5db8:d70e", None),  # NAT64 to 93.184.215.14
        ("64:ff9b:1::a00:1", "reserved_address"),  # local-use NAT64: refused whole
        ("2002:a9fe:a9fe::1", "metadata_address"),  # 6to4 from 169.254.169.254
        ("2002:7f00:1::1", "loopback_address"),  # 6to4 from 127.0.0.1
        ("2002:5db8:d70e::1", None),  # 6to4 from 93.184.215.14
        ("::a00:1", "private_address"),  # IPv4-compatible 10.0.0.1
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "private_address"),  # Teredo
        ("::ffff:0:a00:1", "private_address"),  # IPv4-translated (SIIT) 10.0.0.1
        ("::ffff:0:7f00:1", "loopback_address"),  # IPv4-translated 127.0.0.1
        ("::ffff:0:5db8:d70e", None),  # IPv4-translated 93.184.215.14
        # IANA special-purpose entries that are not globally reachable, whatever Python's
        # `ipaddress` says of them (192.0.0.8 is global to CPython 3.11.7).
        ("192.0.0.8", "private_address"),  # IPv4 dummy address
        ("192.0.0.9", "private_address"),  # anycast inside 192.0.0.0/24: refused with it
        ("192.0.2.10", "private_address"),  # documentation
        ("198.18.0.1", "private_address"),  # benchmarking
        ("240.0.0.1", "private_address"),  # reserved
        ("255.255.255.255", "private_address"),  # limited broadcast
        ("100::1", "private_address"),  # discard-only
        ("2001:db8::1", "private_address"),  # documentation
        ("3fff::1", "reserved_address"),  # documentation (RFC 9637)
        ("5f00::1", "reserved_address"),  # segment routing SIDs
        ("100:0:0:1::1", "reserved_address"),  # dummy IPv6 prefix
        ("fec0::1", "reserved_address"),  # deprecated site-local, outside 2000::/3
        ("4000::1", "reserved_address"),  # not allocated for global unicast
        ("192.31.196.1", None),  # AS112: special-purpose, globally reachable
        ("192.88.99.2", None),  # 6a44 relay anycast: globally reachable
    ],
)
def test_default_refusals(address: str, reason: str | None) -> None:
    assert LinkPolicy().refusal("host.test", address) == reason


def test_allow_list_opens_named_hosts_and_networks() -> None:
    policy = LinkPolicy.from_entries(["Intranet.Example", "10.20.0.0/16", "::1"])
    assert policy.refusal("intranet.example", "10.9.9.9") is None
    assert policy.refusal("intranet.example.", "127.0.0.1") is None
    assert policy.refusal("other.example", "10.20.30.40") is None
    assert policy.refusal("other.example", "10.21.0.1") == "private_address"
    assert policy.refusal("other.example", "::1") is None
    assert policy.refusal("other.example", "169.254.169.254") == "metadata_address"


def test_refusals_do_not_hang_on_pythons_own_address_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if every address were global and none private to `ipaddress`, as its tables say
    # of some ranges in some releases.
    for cls in (ipaddress.IPv4Address, ipaddress.IPv6Address):
        monkeypatch.setattr(cls, "is_global", property(lambda self: True))
        monkeypatch.setattr(cls, "is_private", property(lambda self: False))
    policy = LinkPolicy()
    assert policy.refusal("host.test", "10.0.0.1") == "private_address"
    assert policy.refusal("host.test", "192.0.0.8") == "private_address"
    assert policy.refusal("host.test", "100.64.0.1") == "reserved_address"
    assert policy.refusal("host.test", "fd12:3456::1") == "private_address"
    assert policy.refusal("host.test", "93.184.215.14") is None


def test_allow_list_opens_special_purpose_and_translated_addresses() -> None:
    policy = LinkPolicy.from_entries(["dummy.example", "192.0.0.8", "::ffff:0:0:0/96"])
    assert policy.refusal("dummy.example", "3fff::1") is None
    assert policy.refusal("other.example", "192.0.0.8") is None
    assert policy.refusal("other.example", "192.0.0.170") == "private_address"
    # Matched as resolved: the translated form, not the IPv4 address it carries.
    assert policy.refusal("other.example", "::ffff:0:a00:1") is None
    assert LinkPolicy.from_entries(["10.0.0.0/8"]).refusal("x", "::ffff:0:a00:1") == (
        "private_address"
    )


async def test_a_name_is_refused_when_any_of_its_addresses_is() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return {"mixed.test": ["93.184.215.14", "10.0.0.5"]}[host]

    with pytest.raises(LinkRefused) as info:
        await resolve_checked(LinkPolicy(), resolver, "http://mixed.test/a", "mixed.test", 80)
    error = info.value
    assert error.status_code == 403 and error.reason == "private_address"
    assert error.details == {
        "url": "http://mixed.test/a",
        "host": "mixed.test",
        "address": "10.0.0.5",
    }
    assert "http://mixed.test/a" in error.message and "10.0.0.5" in error.message


async def test_an_unresolvable_name_is_unreadable() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(LinkUnreadable) as info:
        await resolve_checked(LinkPolicy(), resolver, "http://nowhere.test/", "nowhere.test", 80)
    assert info.value.reason == "dns_error"
