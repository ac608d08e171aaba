"""Which POSIX account a job runs as, and what that account may touch.

An agent running as root runs each job as its submitter's account on this node (the portal sends
``user``: the portal username, or the ``posix_user`` an admin set), with the account's groups, home
directory and a private umask (077). It never runs a job as a system account: an account whose uid is
below ``--min-uid`` (1000, as the uid where Debian's and Red Hat's ``useradd`` start people's accounts)
is refused, and root (uid 0) only with ``--allow-root-jobs``. An account missing on the node refuses
the launch, naming the account and the node, and nothing runs. ``--jobs-as USER`` runs every job as
one fixed account instead (the demo's ``npuportal-demo``). An agent not running as root cannot switch
users: it runs every job as itself and says so when it starts; so does ``--jobs-as-agent``.

A job's ``cwd`` and ``output`` are checked *as its account*, by a shell started with the account's
uid and groups (:func:`check_paths`), never by the agent's root looking at modes: the kernel answers
(ACLs included), and a refusal says only "not there, or not reachable by this account", so it reveals
nothing about paths the account cannot look at.

The switch itself happens in the job's wrapper (``runner.py``, which stays root so the exit status it
records cannot be forged by the job): ``subprocess.Popen(user=, group=, extra_groups=, umask=)``.
Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from dataclasses import dataclass

from devices.agent.errors import ApiError

#: The umask of every job: what it creates is its own account's alone unless it says otherwise.
JOB_UMASK = 0o077
#: Account names the agent looks up (POSIX portable names, as ``useradd`` takes them).
ACCOUNT_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
#: A job's working directory when its account has no home directory (``/nonexistent``).
NO_HOME_CWD = "/tmp"
#: Lowest uid a job may run as (``--min-uid``): below it are the system's own accounts (daemon, bin,
#: www-data, postgres...), whose files a job must not own. ``UID_MIN`` of ``/etc/login.defs``.
DEFAULT_MIN_UID = 1000
#: How long the check of a job's paths may take (a hung network file system must not hang the launch).
PATH_CHECK_TIMEOUT_S = 10.0

#: The check of a job's ``cwd`` and ``output``, run by ``/bin/sh`` as the job's account, so every answer
#: is the kernel's for that account (``test -x``/``-w`` are access(2) checks). Arguments: the ``cwd``
#: asked for (empty: none), the account's home, the fallback directory, the ``output`` (empty: none).
#: It prints two words: where the job starts (``cwd``, ``home``, ``fallback``, ``tmp`` or ``no-cwd``) and
#: what of the output (``none``, ``ok``, ``directory`` or ``no-output``).
PATH_CHECK = """
enter() { [ -d "$1" ] && [ -x "$1" ]; }
if [ -n "$1" ]; then
  if enter "$1"; then echo cwd; else echo no-cwd; fi
elif [ -n "$2" ] && enter "$2"; then echo home
elif [ -n "$3" ] && enter "$3"; then echo fallback
else echo tmp
fi
o=$4
if [ -z "$o" ]; then echo none
elif [ -d "$o" ]; then echo directory
elif [ -e "$o" ]; then if [ -w "$o" ]; then echo ok; else echo no-output; fi
else
  p=${o%/*}
  [ -n "$p" ] || p=/
  if [ -d "$p" ] && [ -w "$p" ] && [ -x "$p" ]; then echo ok; else echo no-output; fi
fi
"""


@dataclass(frozen=True)
class Account:
    """One POSIX account as a job runs under it."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    @classmethod
    def of(cls, entry: pwd.struct_passwd) -> Account:
        try:
            groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        except OSError:
            groups = (entry.pw_gid,)
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir, entry.pw_shell or "/bin/sh")


def agent_account() -> Account:
    """The account this agent runs as (its effective uid); a uid without a passwd entry still works."""
    uid = os.geteuid()
    try:
        return Account.of(pwd.getpwuid(uid))
    except KeyError:
        home = os.environ.get("HOME", "/")
        return Account(str(uid), uid, os.getegid(), tuple(os.getgroups()), home, "/bin/sh")


@dataclass(frozen=True)
class AccountPolicy:
    """How the agent picks the account of a job (``--jobs-as-agent``, ``--jobs-as``, ``--allow-root-jobs``,
    ``--min-uid``).
    """

    node: str
    #: Run jobs as another account than the agent's own (only root can).
    switch: bool
    allow_root: bool = False
    #: Every job runs as this one account (``--jobs-as``), whoever submitted it.
    fixed: str | None = None
    min_uid: int = DEFAULT_MIN_UID

    @classmethod
    def for_agent(
        cls,
        node: str,
        *,
        jobs_as_agent: bool = False,
        allow_root: bool = False,
        jobs_as: str | None = None,
        min_uid: int = DEFAULT_MIN_UID,
    ) -> AccountPolicy:
        switch = os.geteuid() == 0 and not jobs_as_agent
        if jobs_as is not None and not switch:
            jobs_as = None  # not root: it can only be the agent's own account (checked by the command line)
        return cls(node, switch=switch, allow_root=allow_root, fixed=jobs_as, min_uid=min_uid)

    @property
    def per_submitter(self) -> bool:
        """Each job runs as its own submitter's account: each may read its own log, and only it."""
        return self.switch and self.fixed is None

    def describe(self) -> str:
        """One line for the agent's start-up message."""
        if self.switch and self.fixed is not None:
            account = self.account_for(None)
            return f"every job runs as the account {account.name} (uid {account.uid}), whoever submitted it (--jobs-as)"
        if self.switch:
            root = "root jobs allowed" if self.allow_root else "never as root"
            return f"jobs run as their submitters' POSIX accounts ({root}; uid {self.min_uid} or above)"
        me = agent_account()
        return f"jobs run as this agent's own account {me.name} (uid {me.uid}), whoever submitted them"

    def account_for(self, user: str | None) -> Account:
        """The account a job of ``user`` runs as here; ``ApiError`` (field ``user``) when there is none."""
        if not self.switch:
            me = agent_account()
            if me.uid == 0 and not self.allow_root:
                raise ApiError(
                    400, "this agent runs as root and would run the job as root; see --allow-root-jobs", "user"
                )
            return me
        if self.fixed is not None:
            user = self.fixed
        elif not user:
            if self.allow_root:
                return agent_account()
            raise ApiError(400, "user is required: this agent runs each job as its submitter's POSIX account", "user")
        if not ACCOUNT_NAME_RE.fullmatch(user):
            raise ApiError(400, f"user {user!r} is not a POSIX account name", "user")
        try:
            account = Account.of(pwd.getpwnam(user))
        except KeyError:
            raise ApiError(400, f"no POSIX account {user!r} on node {self.node}", "user") from None
        refusal = self.refusal(account)
        if refusal is not None:
            raise ApiError(400, refusal, "user")
        return account

    def refusal(self, account: Account) -> str | None:
        """Why no job may run as ``account`` here (root, a system account), or ``None``."""
        if account.uid == 0:
            if self.allow_root:
                return None
            return f"account {account.name!r} is root on node {self.node}; jobs never run as root here"
        if account.uid < self.min_uid:
            return (
                f"account {account.name!r} (uid {account.uid}) is a system account on node {self.node}; "
                f"jobs run only as accounts with uid {self.min_uid} or above (--min-uid)"
            )
        return None


def check_paths(account: Account, cwd: str | None, output: str | None, fallback: str, node: str) -> str:
    """Where the job starts, after checking its ``cwd`` and ``output`` as ``account``; ``ApiError`` else.

    The check runs in a shell started with the account's uid and groups (:data:`PATH_CHECK`), so root
    never answers for it. Without ``cwd`` the job starts in the account's home, else ``fallback`` (the
    agent's state dir for an agent that runs jobs as itself), else :data:`NO_HOME_CWD`. A refusal has
    one wording for "not there" and "there, but this account cannot reach it": the account learns
    nothing of paths it could not look at itself.
    """
    argv = ["/bin/sh", "-c", PATH_CHECK, "npuportal-path-check", cwd or "", account.home or "", fallback, output or ""]
    other = account.uid != os.geteuid()
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            cwd="/",
            timeout=PATH_CHECK_TIMEOUT_S,
            user=account.uid if other else None,
            group=account.gid if other else None,
            extra_groups=list(account.groups) if other else None,
        )
    except subprocess.TimeoutExpired:
        field = "cwd" if cwd else "output"
        raise ApiError(
            503, f"{field}: checking the job's paths took longer than {PATH_CHECK_TIMEOUT_S:g} s on node {node}", field
        ) from None
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 2:
        raise ApiError(500, f"checking the job's paths failed on node {node}: {done.stderr.strip()[:200]}")
    start, out = words
    if start == "no-cwd":
        raise ApiError(
            400,
            f"cwd {cwd}: account {account.name} cannot enter it on node {node} "
            f"(it does not exist there, or {account.name} may not reach it)",
            "cwd",
        )
    if out == "directory":
        raise ApiError(400, f"output {output} is a directory; name a file", "output")
    if out == "no-output":
        raise ApiError(
            400,
            f"output {output}: account {account.name} cannot write it on node {node} "
            f"(it or its directory does not exist there, or {account.name} may not reach or write it)",
            "output",
        )
    return {"cwd": cwd or "", "home": account.home, "fallback": fallback}.get(start, NO_HOME_CWD)
