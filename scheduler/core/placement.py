"""Step 3, filter → score → gang: find devices for a job on one flavor, all replicas or none.

- *filter*: only indexed devices (healthy, schedulable node, not held) of the flavor, on nodes whose labels
  match the job's node selector, with enough free millis and memory — and, beside them on the same node,
  the replica's host CPU and memory (``ReplicaRequest.cpu_millicores``, ``host_memory_mib``).
- *score*: a fraction goes to the fullest card that still fits (best fit; ``worst_fit`` and seeded
  ``random`` are policy options), and a fresh card is taken from the busiest node. Whole cards go to the node
  with the fewest free cards that still has enough (keeps big holes for big jobs), preferring the best link
  between the cards: NVLink domain > PCIe switch > NUMA node > across the node. In energy mode, nodes that
  are already busy win over idle ones before link quality, so idle nodes can sleep.
- *gang*: replicas are placed one after another and everything is rolled back if one does not fit.

All changes go to the ``Cluster`` and are logged in an undo list, so callers can try and roll back.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.core import sentences
from scheduler.core.sentences import clauses, say

from .capacity import Cluster, bucket_of
from .fragment import CANDIDATE_CARDS, Fragmentation
from .fragment import CANDIDATE_NODES as FRAG_CANDIDATE_NODES
from .quota import cards
from .types import FRACTION_STEP_MILLIS, MILLIS_PER_DEVICE, FractionalStrategy, PendingJob, PendingReason, Topology

# How many candidate nodes a whole-card replica looks at before taking the best seen; a node with the best
# possible link ends the search at once. Bounds the work per replica on large clusters.
CANDIDATE_NODES = 24

# (replica, device id, millis, memory_mib, host cpu millicores, host memory MiB); a replica's host resources are
# on the take of its first device, 0 on the others.
Take = tuple[int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class Failure:
    code: PendingReason
    message: str


def rollback(cluster: Cluster, log: list[Take]) -> None:
    for _, d, millis, memory_mib, cpu, host_mem in reversed(log):
        cluster.give(d, millis, memory_mib, cpu, host_mem)
    log.clear()


def host_text(cpu_millicores: int, host_memory_mib: int) -> str:
    """``16 free CPU cores and 64 GiB host memory`` for messages (only the parts asked for)."""
    parts = []
    if cpu_millicores:
        parts.append(f"{cpu_millicores / 1000:g} free CPU cores")
    if host_memory_mib:
        parts.append(f"{host_memory_mib / 1024:g} GiB free host memory")
    return " and ".join(parts)


class Placer:
    def __init__(
        self,
        cluster: Cluster,
        *,
        strategy: FractionalStrategy,
        energy_mode: bool,
        seed: int,
        fragmentation: Fragmentation | None = None,
    ) -> None:
        self.c = cluster
        self.strategy = strategy
        self.fragmentation = fragmentation
        self.energy_mode = energy_mode
        self.rng = random.Random(seed)
        self._selector_nodes: dict[tuple[str, tuple[tuple[str, str], ...]], bool] = {}

    # -- filter ----------------------------------------------------------------------------------------------

    def node_matches(self, n: int, selector: Mapping[str, str]) -> bool:
        if not selector:
            return True
        labels = self.c.node_labels[n]
        return all(labels.get(k) == v for k, v in selector.items())

    def selector_has_nodes(self, flavor: str, selector: Mapping[str, str]) -> bool:
        key = (flavor, tuple(sorted(selector.items())))
        found = self._selector_nodes.get(key)
        if found is None:
            found = any(
                flavor in self.c.node_devs[n]
                and self.node_matches(n, selector)
                and any(self.c.dev_usable[d] for d in self.c.node_devs[n][flavor])
                for n in range(len(self.c.node_name))
            )
            self._selector_nodes[key] = found
        return found

    # -- gang ------------------------------------------------------------------------------------------------

    def place_job(
        self, job: PendingJob, flavor: str, log: list[Take], *, count: int, first_replica: int | None = None
    ) -> Failure | None:
        """``place`` for ``job``'s request on ``flavor``: ``count`` replicas numbered from ``first_replica``
        (default: the job's first), with its topology, node selector and host resources. Every caller that
        places a job's replicas comes through here."""
        req = job.request
        return self.place(
            flavor=flavor,
            millis=req.millis,
            memory_mib=req.memory_mib,
            count=count,
            first_replica=job.first_replica if first_replica is None else first_replica,
            topology=job.topology,
            selector=job.node_selector,
            log=log,
            cpu_millicores=req.cpu_millicores,
            host_memory_mib=req.host_memory_mib,
        )

    def place(
        self,
        *,
        flavor: str,
        millis: int,
        memory_mib: int,
        count: int,
        first_replica: int,
        topology: Topology,
        selector: Mapping[str, str],
        log: list[Take],
        cpu_millicores: int = 0,
        host_memory_mib: int = 0,
    ) -> Failure | None:
        """Place ``count`` replicas; on success the takes are in ``log``, on failure nothing changed."""
        start = len(log)
        host = (cpu_millicores, host_memory_mib)
        if topology == Topology.SAME_NODE and count > 1:
            ok = self._place_same_node(flavor, millis, memory_mib, count, first_replica, selector, log, host)
            if ok:
                return None
            return self.diagnose(
                flavor=flavor,
                millis=millis * count,
                memory_mib=memory_mib,
                topology=Topology.NONE,
                selector=selector,
                placed=0,
                count=count,
                same_node=True,
                fraction_count=count if millis < MILLIS_PER_DEVICE else 0,
                host=(cpu_millicores * count, host_memory_mib * count),
            )
        for i in range(count):
            replica = first_replica + i
            ok = self.place_replica(flavor, millis, memory_mib, replica, topology, selector, log, None, host)
            if not ok:
                placed = i
                del_log = log[start:]
                rollback(self.c, del_log)
                del log[start:]
                return self.diagnose(
                    flavor=flavor,
                    millis=millis,
                    memory_mib=memory_mib,
                    topology=topology,
                    selector=selector,
                    placed=placed,
                    count=count,
                    host=host,
                )
        return None

    def place_replica(
        self,
        flavor: str,
        millis: int,
        memory_mib: int,
        replica: int,
        topology: Topology,
        selector: Mapping[str, str],
        log: list[Take],
        only_node: int | None = None,
        host: tuple[int, int] = (0, 0),
    ) -> bool:
        c = self.c
        cpu, host_mem = host
        if millis < MILLIS_PER_DEVICE:
            d = self._pick_fraction(flavor, millis, memory_mib, selector, only_node, host)
            if d is None:
                return False
            c.take(d, millis, memory_mib, cpu, host_mem)
            log.append((replica, d, millis, memory_mib, cpu, host_mem))
            return True
        devs = self._pick_cards(flavor, millis // MILLIS_PER_DEVICE, memory_mib, topology, selector, only_node, host)
        if devs is None:
            return False
        for i, d in enumerate(devs):
            mem = c.dev_mem[d]
            cpu_here, mem_here = (cpu, host_mem) if i == 0 else (0, 0)
            c.take(d, MILLIS_PER_DEVICE, mem, cpu_here, mem_here)
            log.append((replica, d, MILLIS_PER_DEVICE, mem, cpu_here, mem_here))
        return True

    def _place_same_node(
        self,
        flavor: str,
        millis: int,
        memory_mib: int,
        count: int,
        first_replica: int,
        selector: Mapping[str, str],
        log: list[Take],
        host: tuple[int, int] = (0, 0),
    ) -> bool:
        c = self.c
        cpu, host_mem = host
        if millis >= MILLIS_PER_DEVICE:
            per = millis // MILLIS_PER_DEVICE
            total = (cpu * count, host_mem * count)
            devs = self._pick_cards(flavor, per * count, memory_mib, Topology.NONE, selector, None, total)
            if devs is None:
                return False
            for i, d in enumerate(devs):
                mem = c.dev_mem[d]
                cpu_here, mem_here = (cpu, host_mem) if i % per == 0 else (0, 0)
                c.take(d, MILLIS_PER_DEVICE, mem, cpu_here, mem_here)
                log.append((first_replica + i // per, d, MILLIS_PER_DEVICE, mem, cpu_here, mem_here))
            return True
        # Fractions on one node: try the nodes that have any capacity, fullest first.
        start = len(log)
        for n in self._nodes_with_capacity(flavor, selector):
            ok = True
            for i in range(count):
                if not self.place_replica(
                    flavor, millis, memory_mib, first_replica + i, Topology.NONE, {}, log, n, host
                ):
                    ok = False
                    break
            if ok:
                return True
            rollback(c, log[start:])
            del log[start:]
        return False

    def _nodes_with_capacity(self, flavor: str, selector: Mapping[str, str]) -> list[int]:
        c = self.c
        seen: dict[int, None] = {}
        for b in range(1, len(c.frac[flavor])):
            for d in c.frac[flavor][b]:
                seen.setdefault(c.dev_node[d], None)
        for k in range(1, len(c.whole[flavor])):
            for n in c.whole[flavor][k]:
                seen.setdefault(n, None)
        return [n for n in seen if self.node_matches(n, selector)]

    # -- score: fractions ------------------------------------------------------------------------------------

    def _pick_fraction(
        self,
        flavor: str,
        millis: int,
        memory_mib: int,
        selector: Mapping[str, str],
        only_node: int | None,
        host: tuple[int, int] = (0, 0),
    ) -> int | None:
        c = self.c
        cpu, host_mem = host
        wants_host = bool(cpu or host_mem)
        free_cpu = c.node_free_cpu
        free_host_mem = c.node_free_host_mem
        if only_node is not None:
            if wants_host and not c.host_fits(only_node, cpu, host_mem):
                return None
            best = None
            for d in c.node_devs[only_node].get(flavor, ()):
                if c.indexed(d) and c.dev_free_millis[d] >= millis and c.dev_free_mem[d] >= memory_mib:
                    key = c.dev_free_millis[d]
                    if best is None or key < best[0]:
                        best = (key, d)
            return None if best is None else best[1]
        frac = c.frac.get(flavor)
        if frac is None:
            return None
        lowest = -(-millis // FRACTION_STEP_MILLIS)
        free_mem = c.dev_free_mem
        dev_node = c.dev_node
        if self.strategy == FractionalStrategy.RANDOM:
            pool: list[int] = []
            for b in range(lowest, len(frac)):
                for d in frac[b]:
                    n = dev_node[d]
                    if (
                        free_mem[d] >= memory_mib
                        and self.node_matches(n, selector)
                        and (not wants_host or (free_cpu[n] >= cpu and free_host_mem[n] >= host_mem))
                    ):
                        pool.append(d)
                        if len(pool) >= 64:
                            break
            fresh = self._fresh_card(flavor, memory_mib, selector, busiest=True, host=host)
            if fresh is not None:
                pool.append(fresh)
            return self.rng.choice(pool) if pool else None
        if self.strategy == FractionalStrategy.FRAGMENTATION and self.fragmentation is not None:
            return self._pick_fragmentation(flavor, millis, memory_mib, selector, host)
        if self.strategy == FractionalStrategy.WORST_FIT:
            fresh = self._fresh_card(flavor, memory_mib, selector, busiest=False, host=host)
            if fresh is not None:
                return fresh
            buckets = range(len(frac) - 1, lowest - 1, -1)
        else:
            buckets = range(lowest, len(frac))
        for b in buckets:
            for d in frac[b]:
                if free_mem[d] >= memory_mib and (not selector or self.node_matches(dev_node[d], selector)):
                    if wants_host:
                        n = dev_node[d]
                        if free_cpu[n] < cpu or free_host_mem[n] < host_mem:
                            continue
                    return d
        if self.strategy == FractionalStrategy.WORST_FIT:
            return None
        return self._fresh_card(flavor, memory_mib, selector, busiest=True, host=host)

    def _pick_fragmentation(
        self, flavor: str, millis: int, memory_mib: int, selector: Mapping[str, str], host: tuple[int, int]
    ) -> int | None:
        """FGD: the candidate card whose node's fragmentation grows the least (``fragment.py``)."""
        c = self.c
        frac = c.frac[flavor]
        cards: list[int] = []
        for b in range(-(-millis // FRACTION_STEP_MILLIS), len(frac)):
            for d in frac[b]:
                n = c.dev_node[d]
                if c.dev_free_mem[d] >= memory_mib and self.node_matches(n, selector) and c.host_fits(n, *host):
                    cards.append(d)
                    if len(cards) >= CANDIDATE_CARDS:
                        break
            if len(cards) >= CANDIDATE_CARDS:
                break
        fresh: list[int] = []
        buckets = c.whole.get(flavor) or []
        for k in range(1, len(buckets)):
            for n in buckets[k]:
                if self.node_matches(n, selector) and c.host_fits(n, *host):
                    fresh.append(n)
                    if len(fresh) >= FRAG_CANDIDATE_NODES:
                        break
            if len(fresh) >= FRAG_CANDIDATE_NODES:
                break
        assert self.fragmentation is not None
        return self.fragmentation.pick(flavor, millis, cards, fresh, host, lambda d: c.dev_mem[d] >= memory_mib)

    def _fresh_card(
        self,
        flavor: str,
        memory_mib: int,
        selector: Mapping[str, str],
        *,
        busiest: bool,
        host: tuple[int, int] = (0, 0),
    ) -> int | None:
        """A fully free card: on the node with the fewest free cards (``busiest``) or the most."""
        c = self.c
        buckets = c.whole.get(flavor)
        if not buckets:
            return None
        ks = range(1, len(buckets)) if busiest else range(len(buckets) - 1, 0, -1)
        for k in ks:
            for n in buckets[k]:
                if not self.node_matches(n, selector) or not c.host_fits(n, *host):
                    continue
                for d in c.node_devs[n][flavor]:
                    if c.indexed(d) and c.is_free(d) and c.dev_mem[d] >= memory_mib:
                        return d
        return None

    # -- score: whole cards ----------------------------------------------------------------------------------

    def _pick_cards(
        self,
        flavor: str,
        n_cards: int,
        memory_mib: int,
        topology: Topology,
        selector: Mapping[str, str],
        only_node: int | None,
        host: tuple[int, int] = (0, 0),
    ) -> list[int] | None:
        c = self.c
        cpu, host_mem = host
        buckets = c.whole.get(flavor)
        if not buckets or n_cards >= len(buckets):
            return None
        candidates = None if only_node is None else [(c.node_free_whole[flavor][only_node], only_node)]
        best: tuple[tuple, list[int]] | None = None
        examined = 0
        top_score = self._top_score(flavor, n_cards, topology)
        frag = (
            self.fragmentation
            if self.strategy == FractionalStrategy.FRAGMENTATION and not self.energy_mode and (cpu or host_mem)
            else None
        )

        def consider(k: int, n: int) -> bool:
            """Returns True when the search can stop."""
            nonlocal best, examined
            if not self.node_matches(n, selector) or not c.host_fits(n, cpu, host_mem):
                return False
            devs = [d for d in c.node_devs[n][flavor] if c.indexed(d) and c.is_free(d) and c.dev_mem[d] >= memory_mib]
            if len(devs) < n_cards:
                return False
            examined += 1
            group, score = self._best_group(devs, n_cards, topology)
            if group is None:
                return examined >= CANDIDATE_NODES
            idle = 1 if c.node_busy[n] == 0 else 0
            if frag is not None:
                # FGD: the node whose fragmentation grows the least, then the best link, then best fit.
                key: tuple = (frag.whole_delta(n, flavor, n_cards, host), -score, k)
                if best is None or key < best[0]:
                    best = (key, group)
                return examined >= CANDIDATE_NODES
            key = (idle, -score, k) if self.energy_mode else (-score, k)
            if best is None or key < best[0]:
                best = (key, group)
            top = (0, -top_score) if self.energy_mode else (-top_score,)
            return key[: len(top)] == top or examined >= CANDIDATE_NODES

        if candidates is not None:
            for k, n in candidates:
                if k >= n_cards:
                    consider(k, n)
        else:
            stop = False
            for k in range(n_cards, len(buckets)):
                for n in buckets[k]:
                    if consider(k, n):
                        stop = True
                        break
                if stop:
                    break
        return None if best is None else best[1]

    def _top_score(self, flavor: str, n: int, topology: Topology) -> int:
        """The best link score any node of ``flavor`` could give ``n`` cards: a candidate that reaches it
        ends the search (3 NVLink, 2 PCIe switch, 1 NUMA, 0 none)."""
        if n == 1:
            return 3
        nvlink, pcie, numa = self.c.max_group.get(flavor, (0, 0, 0))
        if topology == Topology.NUMA:
            return 1
        for score, size in ((3, nvlink), (2, pcie), (1, numa)):
            if size >= n:
                return score
        return 0

    def _best_group(self, devs: list[int], n: int, topology: Topology) -> tuple[list[int] | None, int]:
        """The ``n`` devices with the best common link, and its score (3 NVLink .. 0 none)."""
        if n == 1:
            return devs[:1], 3
        c = self.c
        levels: tuple[tuple[int, list], ...] = ((3, c.dev_nvlink), (2, c.dev_pcie), (1, c.dev_numa))
        for score, attr in levels:
            if topology == Topology.NUMA and score != 1:
                continue
            groups: dict[object, list[int]] = {}
            for d in devs:
                key = attr[d]
                if key is not None:
                    groups.setdefault(key, []).append(d)
            fitting = [g for g in groups.values() if len(g) >= n]
            if fitting:
                return min(fitting, key=len)[:n], score
            if topology in (Topology.NVLINK, Topology.NUMA):
                return None, -1
        return devs[:n], 0

    # -- why not ---------------------------------------------------------------------------------------------

    def _host_short(
        self,
        flavor: str,
        millis: int,
        memory_mib: int,
        selector: Mapping[str, str],
        host: tuple[int, int],
        skip: bool,
    ) -> Failure | None:
        """``INSUFFICIENT_HOST`` when the cards the request needs are free on some node but no such node has
        the host CPU and memory beside them; None otherwise (or when no host resources are asked for)."""
        cpu, host_mem = host
        if not (cpu or host_mem) or skip:
            return None
        c = self.c
        need_cards = max(1, millis // MILLIS_PER_DEVICE)
        card_room = False
        for n in range(len(c.node_name)):
            devs = c.node_devs[n].get(flavor)
            if not devs or not self.node_matches(n, selector):
                continue
            if millis < MILLIS_PER_DEVICE:
                fits = any(
                    c.indexed(d) and c.dev_free_millis[d] >= millis and c.dev_free_mem[d] >= memory_mib for d in devs
                )
            else:
                fits = sum(1 for d in devs if c.indexed(d) and c.is_free(d)) >= need_cards
            if not fits:
                continue
            if c.host_fits(n, cpu, host_mem):
                return None  # some node has both: the failure is something else
            card_room = True
        if not card_room:
            return None
        what = f"{cards(millis)} free {flavor} card{'s' if millis > MILLIS_PER_DEVICE else ''}"
        return Failure(PendingReason.INSUFFICIENT_HOST, f"no node has {host_text(cpu, host_mem)} beside {what}")

    def diagnose(
        self,
        *,
        flavor: str,
        millis: int,
        memory_mib: int,
        topology: Topology,
        selector: Mapping[str, str],
        placed: int,
        count: int,
        same_node: bool = False,
        fraction_count: int = 0,
        host: tuple[int, int] = (0, 0),
    ) -> Failure:
        """Explain in words why a job does not fit right now."""
        c = self.c
        short = self._host_short(flavor, millis, memory_mib, selector, host, bool(fraction_count))
        if short is not None and placed == 0:
            return short
        if not c.has_flavor(flavor):
            return Failure(PendingReason.NO_SUCH_FLAVOR, say(sentences.NO_HEALTHY_SCHEDULABLE_DEVICE, flavor=flavor))
        if selector and not self.selector_has_nodes(flavor, selector):
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
            return Failure(
                PendingReason.NO_MATCHING_NODE, say(sentences.NO_SCHEDULABLE_NODE_MATCHES, flavor=flavor, wanted=wanted)
            )
        if placed > 0:
            return Failure(
                PendingReason.GANG,
                clauses(
                    say(sentences.ONLY_REPLICAS_FIT_ONCE, placed=placed, count=count),
                    say(sentences.JOB_STARTS_WHEN_ALL, count=count),
                ),
            )
        if fraction_count:
            return Failure(
                PendingReason.INSUFFICIENT_CAPACITY,
                say(
                    sentences.NO_NODE_ROOM_X,
                    count=fraction_count,
                    size=cards(millis // fraction_count),
                    flavor=flavor,
                    mem=memory_mib,
                ),
            )
        if millis < MILLIS_PER_DEVICE:
            lowest = bucket_of(millis + FRACTION_STEP_MILLIS - 1)
            roomy = any(c.frac[flavor][b] for b in range(lowest, len(c.frac[flavor]) - 1))
            if roomy or c.max_free_whole(flavor) > 0:
                return Failure(
                    PendingReason.INSUFFICIENT_MEMORY,
                    say(sentences.NO_CARD_CARD_MIB, flavor=flavor, size=cards(millis), mem=memory_mib),
                )
            return Failure(
                PendingReason.INSUFFICIENT_CAPACITY,
                say(sentences.NO_CARD_CARD_MILLIS, flavor=flavor, size=cards(millis), millis=millis),
            )
        n = millis // MILLIS_PER_DEVICE
        largest = c.max_devices_per_node(flavor)
        where = "one node" if not same_node else "one node for all replicas"
        if n > largest:
            return Failure(
                PendingReason.INSUFFICIENT_CAPACITY,
                clauses(
                    say(sentences.NO_NODE_CARDS_LARGEST, n=n, flavor=flavor, largest=largest),
                    sentences.ASK_FEWER_CARDS_PER,
                ),
            )
        most_free = c.max_free_whole(flavor)
        if most_free < n:
            return Failure(
                PendingReason.INSUFFICIENT_CAPACITY,
                f"no node has {n} free {flavor} cards on {where} right now (most free on one node: {most_free})",
            )
        if memory_mib and not any(
            c.dev_mem[d] >= memory_mib for d in range(len(c.dev_uuid)) if c.dev_flavor[d] == flavor
        ):
            return Failure(
                PendingReason.INSUFFICIENT_MEMORY, say(sentences.NO_CARD_MIB_MEMORY, flavor=flavor, mem=memory_mib)
            )
        if topology == Topology.NVLINK:
            return Failure(PendingReason.TOPOLOGY, say(sentences.NO_NODE_FREE_CARDS_ONE_NVLINK, n=n, flavor=flavor))
        if topology == Topology.NUMA:
            return Failure(PendingReason.TOPOLOGY, say(sentences.NO_NODE_FREE_CARDS_ONE_NUMA, n=n, flavor=flavor))
        return Failure(
            PendingReason.INSUFFICIENT_CAPACITY,
            say(sentences.NO_NODE_FREE_CARDS_MATCH, n=n, flavor=flavor),
        )
