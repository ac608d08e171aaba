"""Fair share: Slurm's *classic* algorithm over department → team → user.

Why classic and not Fair Tree: the classic factor of a user depends on its own
usage *and* on how much its team and department used, with one closed formula
per level that an admin can redo by hand (``docs/engine.md`` shows it), and it
is what Slurm documents with a worked example that our tests reproduce.

Definitions (https://slurm.schedmd.com/classic_fair_share.html):

* normalised shares ``S`` = product down the tree of ``shares / sum of the
  siblings' shares`` (the siblings include the account itself);
* raw usage of an account = its own usage plus its children's;
* normalised usage ``U`` = raw usage / total cluster usage;
* effective usage: ``UE = U`` for accounts directly under root, below that
  ``UE = U + (UE_parent - U) * shares / sum of the siblings' shares``;
* factor ``F = 2 ** (-UE / S)``; ``0`` when ``S`` is 0; with no usage at all
  every ``UE`` is 0, so every factor is 1.

A tree is a plain mapping ``name -> {"parent": name | None, "shares": number,
"usage": number}`` (``usage`` only on leaves, absent means 0), so the ORM side,
the tests and a console command can all build one without engine types. A
node whose parent is ``None`` hangs from the (implicit) root.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduling.engine.policy import Policy
from scheduling.engine.record import Record

#: Tree node as given: ``{"parent": str | None, "shares": float, "usage": float}``.
Tree = Mapping[str, Mapping[str, object]]


@dataclass(frozen=True, slots=True)
class FairShareRow(Record):
    """One association's numbers, as ``sshare -l`` shows them."""

    name: str
    parent: str | None
    depth: int
    raw_shares: float
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effective_usage: float
    fair_share: float


def fair_share_table(tree: Tree, total_usage: float | None = None) -> list[FairShareRow]:
    """Every node of ``tree`` with its classic fair-share numbers, parents first.

    ``total_usage`` is the cluster's total (decayed) usage that ``U`` divides
    by; it defaults to the sum of all usage in the tree, which is what the ORM
    side feeds. Slurm divides by the machine's total, which may exceed the sum
    of the associations' usage: the docs' example gives usage as fractions of
    the machine (summing to 0.7) and so needs ``total_usage=1.0``.

    Siblings are visited in name order so the table is stable.
    """
    children: dict[str | None, list[str]] = {}
    for name, node in tree.items():
        parent = node.get("parent")
        if parent is not None and parent not in tree:
            raise ValueError(f"fair-share node {name!r} has unknown parent {parent!r}")
        children.setdefault(parent if isinstance(parent, str) else None, []).append(name)
    for kids in children.values():
        kids.sort()

    order: list[tuple[str, int]] = []  # (name, depth), parents before children
    stack = [(name, 0) for name in reversed(children.get(None, []))]
    while stack:
        name, depth = stack.pop()
        order.append((name, depth))
        stack.extend((kid, depth + 1) for kid in reversed(children.get(name, [])))
    if len(order) != len(tree):
        raise ValueError("fair-share tree has a cycle")

    raw_usage: dict[str, float] = {}
    for name, _ in reversed(order):  # children before parents
        own = float(tree[name].get("usage", 0.0) or 0.0)  # type: ignore[arg-type]
        raw_usage[name] = own + sum(raw_usage[kid] for kid in children.get(name, []))
    total = float(total_usage) if total_usage is not None else sum(raw_usage[name] for name in children.get(None, []))

    shares = {name: float(tree[name].get("shares", 0.0) or 0.0) for name in tree}  # type: ignore[arg-type]
    sibling_sum = {parent: sum(shares[kid] for kid in kids) for parent, kids in children.items()}
    norm_shares: dict[str, float] = {}
    effective: dict[str, float] = {}
    rows: list[FairShareRow] = []
    for name, depth in order:
        parent_raw = tree[name].get("parent")
        parent = parent_raw if isinstance(parent_raw, str) else None
        siblings = sibling_sum[parent]
        local = shares[name] / siblings if siblings > 0 else 0.0
        s = local * (norm_shares[parent] if parent is not None else 1.0)
        norm_shares[name] = s
        u = raw_usage[name] / total if total > 0 else 0.0
        ue = u if parent is None else u + (effective[parent] - u) * local
        effective[name] = ue
        factor = 2.0 ** (-ue / s) if s > 0 else 0.0
        rows.append(FairShareRow(name, parent, depth, shares[name], s, raw_usage[name], u, ue, factor))
    return rows


def fair_share_factors(tree: Tree, total_usage: float | None = None) -> dict[str, float]:
    """Classic fair-share factor ``F = 2**(-UE/S)`` of EVERY node of ``tree``."""
    return {row.name: row.fair_share for row in fair_share_table(tree, total_usage)}


def user_leaf(team: str, user: str) -> str:
    """Tree name of a user: ``team/user`` (user names repeat across teams)."""
    return f"{team}/{user}"


def tree_from_usage(
    policy: Policy,
    usage: Mapping[tuple[str, str], float],
    users: Iterable[tuple[str, str]] = (),
) -> dict[str, dict[str, object]]:
    """The department → team → user tree of a policy and the ORM's usage.

    Users are every ``(team, user)`` in ``usage`` or ``users`` (pass the
    pending jobs' owners so a newcomer gets a factor), one share each: inside a
    team, users are equals. Teams are the policy's plus any seen there, with
    their policy's shares (the defaults for an unnamed team). Departments come
    from ``policy.departments``; a team whose department is not listed, or that
    has none, hangs from root. A department named like a team is renamed
    ``dept/<name>`` so both keep a node.
    """
    pairs = set(usage) | set(users)
    team_names = set(policy.teams) | {team for team, _ in pairs}
    dept_key = {d: (f"dept/{d}" if d in team_names else d) for d in policy.departments}
    tree: dict[str, dict[str, object]] = {}
    for dept, shares in policy.departments.items():
        tree[dept_key[dept]] = {"parent": None, "shares": float(shares)}
    for team in sorted(team_names):
        tp = policy.team(team)
        parent = dept_key.get(tp.department) if tp.department else None
        tree[team] = {"parent": parent, "shares": float(tp.shares)}
    for team, user in sorted(pairs):
        tree[user_leaf(team, user)] = {
            "parent": team,
            "shares": 1.0,
            "usage": float(usage.get((team, user), 0.0)),
        }
    return tree


def format_sshare(tree: Tree, factors: Mapping[str, float] | None = None) -> str:
    """An ``sshare -l``-like table of the tree (children indented under parents).

    ``factors`` overrides the FairShare column (pass what the tick used); the
    other columns are recomputed from ``tree``.
    """
    rows = fair_share_table(tree)
    header = ("Account", "RawShares", "NormShares", "RawUsage", "NormUsage", "EffectvUsage", "FairShare")
    lines = []
    width = max([len(header[0])] + [row.depth + len(row.name) for row in rows])
    lines.append(
        f"{header[0]:<{width}} {header[1]:>10} {header[2]:>11} {header[3]:>12} "
        f"{header[4]:>11} {header[5]:>13} {header[6]:>10}"
    )
    lines.append(" ".join("-" * w for w in (width, 10, 11, 12, 11, 13, 10)))
    for row in rows:
        fs = factors.get(row.name, row.fair_share) if factors is not None else row.fair_share
        name = " " * row.depth + row.name
        lines.append(
            f"{name:<{width}} {row.raw_shares:>10g} {row.norm_shares:>11.6f} "
            f"{row.raw_usage:>12.2f} {row.norm_usage:>11.6f} {row.effective_usage:>13.6f} "
            f"{fs:>10.6f}"
        )
    return "\n".join(lines) + "\n"


class TreeShape:
    """The part of :func:`fair_share_table` that does not depend on usage, for repeated ticks.

    A tick only needs the factor of each user with a pending job, and between
    ticks only the usage numbers move: the tree (policy shares, departments,
    the set of users) stays. The shape is worked out once per policy and set of
    users; :meth:`factors` then does the same float operations, in the same
    order, as :func:`fair_share_table` on :func:`tree_from_usage`'s tree, so
    both give bit-identical factors (tests compare them).
    """

    __slots__ = ("kids", "leaves", "local", "norm", "pairs", "parent", "policy", "roots")

    def __init__(self, policy: Policy, pairs: frozenset[tuple[str, str]]) -> None:
        self.policy = policy
        self.pairs = pairs
        tree = tree_from_usage(policy, {}, pairs)
        rows = fair_share_table(tree)  # parents first; validates the tree
        index = {row.name: i for i, row in enumerate(rows)}
        self.parent = [index[row.parent] if row.parent is not None else -1 for row in rows]
        kids: list[list[int]] = [[] for _ in rows]
        roots: list[int] = []
        for i, row in enumerate(rows):
            if row.parent is None:
                roots.append(i)
            else:
                kids[index[row.parent]].append(i)
        for k in kids:  # name order, as fair_share_table sums them
            k.sort(key=lambda j: rows[j].name)
        roots.sort(key=lambda j: rows[j].name)
        self.kids = kids
        self.roots = roots
        self.norm = [row.norm_shares for row in rows]
        shares = [row.raw_shares for row in rows]
        sums: dict[int, float] = {}
        for p in self.parent:
            if p not in sums:
                sums[p] = sum(shares[j] for j in (kids[p] if p >= 0 else roots))
        self.local = [shares[i] / sums[p] if sums[p] > 0 else 0.0 for i, p in enumerate(self.parent)]
        #: (row, (team, user)) of every user leaf.
        self.leaves = [(index[user_leaf(team, user)], (team, user)) for team, user in pairs]

    def factors(self, usage: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
        """Fair-share factor of every ``(team, user)`` of the shape under ``usage``."""
        n = len(self.parent)
        raw = [0.0] * n
        get = usage.get
        for i, pair in self.leaves:
            raw[i] = float(get(pair, 0.0))
        kids = self.kids
        for i in range(n - 1, -1, -1):  # children before parents
            k = kids[i]
            if k:
                raw[i] = raw[i] + sum(raw[j] for j in k)
            else:
                raw[i] = raw[i] + 0
        total = sum(raw[i] for i in self.roots)
        parent = self.parent
        local = self.local
        norm = self.norm
        effective = [0.0] * n
        factor = [0.0] * n
        for i in range(n):
            u = raw[i] / total if total > 0 else 0.0
            p = parent[i]
            ue = u if p < 0 else u + (effective[p] - u) * local[i]
            effective[i] = ue
            s = norm[i]
            factor[i] = 2.0 ** (-ue / s) if s > 0 else 0.0
        return {pair: factor[i] for i, pair in self.leaves}


_shapes: dict[int, TreeShape] = {}


def user_factors(
    policy: Policy, usage: Mapping[tuple[str, str], float], users: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], float]:
    """Factors of ``users`` (and of everyone in ``usage``' tree), as a tick needs them.

    Same numbers as ``fair_share_factors(tree_from_usage(policy, usage, users))``;
    the tree's shape is kept per policy and set of users (:class:`TreeShape`).
    """
    users = set(users)
    pairs = frozenset(set(usage) | users)
    shape = _shapes.get(id(policy))
    if shape is None or shape.policy is not policy or shape.pairs != pairs:
        shape = TreeShape(policy, pairs)
        if len(_shapes) > 8:
            _shapes.clear()
        _shapes[id(policy)] = shape
    factors = shape.factors(usage)
    return {pair: factors[pair] for pair in users}
