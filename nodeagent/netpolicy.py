"""Network isolation between tenants: another tenant's job cannot connect to a job's sockets.

Workloads use the node's own network (as most GPU clusters run training, for NCCL and RDMA), each as its
tenant's uid (``nodeagent.sandbox``). The agent keeps one nftables table, ``inet gpupool`` by default, whose
``output`` chain, for each tenant with a workload here:

* marks every connection a workload of that tenant opens with the tenant's uid (``ct mark``);
* drops the answer of that tenant's sockets to a connection marked with another uid — so a process of tenant
  B on this node that connects to a port of tenant A's job is refused: its SYN is answered by nothing, its
  retransmission by a TCP reset (the first rule), so ``connect`` fails with ``ECONNREFUSED`` within about 1 s;
* drops the answer of that tenant's sockets to a connection from another machine (one that did not come
  through loopback) unless the machine is one of the nodes where that tenant's jobs run (``peer_addresses`` of
  their starts) or an operator-allowed network (``--network-allow-from``, e.g. the serving proxy's hosts).

Processes outside the sandbox (root, the agent, the operator's services) open unmarked connections and are not
restricted on this node. A job's own replicas — same uid, or on one of its nodes — always reach each other, on
any port (gloo's and NCCL's data ports are random). Connections a job opens to the outside world are untouched.

What it does not do, and what an operator adds (docs/distributed-training.md, "Network isolation"): two
tenants' jobs on one *other* node share that node's address, so across nodes a connection is told apart by
machine, not by tenant; dedicate nodes per tenant (node selectors) or add per-tenant networks (VLAN/VRF, a CNI
with network policies) where that matters. ``--sandbox none`` (development) runs workloads as the agent's own
user: nothing is isolated.

The rules are written with the ``nft`` command (Debian's ``nftables``), the whole table replaced in one
atomic transaction whenever the set of tenants or peers on the node changes, and deleted when no workload has
run here for :data:`RULES_LINGER_S`. A tenant's rules stay that long after its last workload on the node ended:
they match only sockets of the tenant's uid, and none is left (the sandbox's cleanup killed every process of the
workload's cgroup), so they restrict nothing — and its next workload, if it has the same peers, starts without
an ``nft`` run. Before, a node running short jobs ran ``nft`` twice per job (the table made at the start, deleted
at the end): about 9.5 ms of CPU and 37 ms of the agent's loop each time. ``python3-nftables`` binds the same
library, but only for Debian's interpreter, not the agent's virtual environment; the JSON it takes is no shorter
than the ruleset text.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

log = logging.getLogger(__name__)

DEFAULT_TABLE = "gpupool"
#: ``ct mark`` of a connection whose answer was refused: its next packet from the client is reset.
REFUSED_MARK = 1
#: Seconds a tenant uid's rules are kept after its last workload on the node ended (see the module's text).
RULES_LINGER_S = 60.0


class IsolationMode(StrEnum):
    NFTABLES = "nftables"
    NONE = "none"


class NetworkPolicyError(RuntimeError):
    """The rules could not be written; the workload fails rather than run reachable by other tenants."""


def _address_family(address: str) -> str | None:
    try:
        return "ip" if ipaddress.ip_network(address, strict=False).version == 4 else "ip6"
    except ValueError:
        return None


def render_ruleset(
    *, table: str, tenants: Mapping[int, Iterable[str]], allow_from: Iterable[str] = (), replace: bool = True
) -> str:
    """The nft script that makes ``table`` isolate ``tenants`` (uid → addresses of the nodes its jobs run on).

    ``replace``: the script deletes the table first (``nft`` applies a script atomically, so there is no instant
    without rules). Addresses that are not IP addresses (host names) are skipped: nftables matches addresses.
    """
    allowed = sorted({a for a in allow_from if _address_family(a)})
    lines = []
    if replace:
        lines += [f"table inet {table}", f"delete table inet {table}"]
    lines += [f"table inet {table} {{", "  chain output {", "    type filter hook output priority 0; policy accept;"]
    lines.append(f"    ct direction original ct mark {REFUSED_MARK} reject with tcp reset")
    for uid in sorted(tenants):
        lines.append(f"    ct direction original ct state new meta skuid {uid} ct mark set {uid}")
    for uid in sorted(tenants):
        lines.append(
            f"    ct direction reply meta skuid {uid} ct mark != 0 ct mark != {uid} ct mark set {REFUSED_MARK} drop"
        )
        peers = sorted({a for a in tenants[uid] if _address_family(a)} | set(allowed))
        # An answer leaving for another machine (not through loopback): only to the tenant's peers and the
        # allowed networks.
        remote = f'ct direction reply ct mark 0 oifname != "lo" meta skuid {uid}'
        for family, proto in (("ip", "ipv4"), ("ip6", "ipv6")):
            mine = [a for a in peers if _address_family(a) == family]
            only = f" {family} daddr != {{ {', '.join(mine)} }}" if mine else ""
            lines.append(f"    {remote} meta nfproto {proto}{only} drop")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


@dataclass
class NetworkIsolation:
    """The node's rules, rewritten when the tenants or peers change (:meth:`sync`)."""

    mode: IsolationMode = IsolationMode.NFTABLES
    table: str = DEFAULT_TABLE
    allow_from: tuple[str, ...] = ()
    nft: str = "nft"
    linger_s: float = RULES_LINGER_S
    clock: Callable[[], float] = time.monotonic
    _applied: dict[int, frozenset[str]] | None = field(default=None, init=False)
    #: When each uid in the applied rules that has no workload here any more lost its last one.
    _idle_since: dict[int, float] = field(default_factory=dict, init=False)
    problem: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.mode == IsolationMode.NFTABLES and shutil.which(self.nft) is None:
            self.problem = f"{self.nft!r} was not found (apt-get install nftables)"
        for network in self.allow_from:
            if _address_family(network) is None:
                raise ValueError(f"--network-allow-from {network!r} is not an IP address or network")

    @property
    def describe(self) -> str:
        if self.mode == IsolationMode.NONE:
            return "none"
        return f"nftables table inet {self.table}" + (f" (unavailable: {self.problem})" if self.problem else "")

    def sync(self, tenants: Mapping[int, Iterable[str]]) -> None:
        """Make the rules isolate ``tenants`` (uid → peer node addresses), and keep those of a uid whose last
        workload here ended less than :attr:`linger_s` ago; nothing when that is what they do already. Raises
        :class:`NetworkPolicyError` when the rules cannot be written."""
        if self.mode == IsolationMode.NONE:
            return
        now = self.clock()
        wanted = {uid: frozenset(peers) for uid, peers in tenants.items()}
        for uid, peers in (self._applied or {}).items():
            if uid in wanted:
                continue
            idle_since = self._idle_since.setdefault(uid, now)
            if now - idle_since < self.linger_s:
                wanted[uid] = peers  # no workload of this uid left: its rules match nothing; kept for its next one
        self._idle_since = {uid: since for uid, since in self._idle_since.items() if uid not in tenants}
        if wanted == self._applied:
            return
        if self.problem:
            raise NetworkPolicyError(f"network isolation: {self.problem}")
        if not wanted:
            self.clear()
            return
        script = render_ruleset(table=self.table, tenants=wanted, allow_from=self.allow_from)
        result = subprocess.run([self.nft, "-f", "-"], input=script, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise NetworkPolicyError(f"network isolation: nft refused the rules: {result.stderr.strip()[:500]}")
        self._applied = wanted
        self._idle_since = {uid: since for uid, since in self._idle_since.items() if uid in wanted}
        log.info("netpolicy: table inet %s isolates %d tenant uid(s)", self.table, len(wanted))

    def linger_over(self) -> bool:
        """Whether the rules of a uid without workloads here have been kept their :attr:`linger_s`: the next
        :meth:`sync` removes them."""
        return any(self.clock() - since >= self.linger_s for since in self._idle_since.values())

    def clear(self) -> None:
        """Remove the table (no workload left to isolate)."""
        if self.mode == IsolationMode.NONE or self.problem:
            return
        subprocess.run([self.nft, "delete", "table", "inet", self.table], capture_output=True, text=True, check=False)
        self._applied = {}
        self._idle_since = {}
