"""Which POSIX account a job runs as, and what that account may touch.

An agent running as root runs each job as its submitter's account on this node (the portal sends
``user``: the portal username, or the ``posix_user`` an admin set), with the account's groups, home
directory and a private umask (077), never as root unless the agent was started with
``--allow-root-jobs``. An account missing on the node refuses the launch, naming the account and the
node, and nothing runs. An agent not running as root cannot switch users: it runs every job as
itself (the demo) and says so when it starts; so does ``--jobs-as-agent``.

The switch itself happens in the job's wrapper (``runner.py``, which stays root so the exit status it
records cannot be forged by the job): ``subprocess.Popen(user=, group=, extra_groups=, umask=)``.
Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from dataclasses import dataclass

from devices.agent.errors import ApiError

#: The umask of every job: what it creates is its own account's alone unless it says otherwise.
JOB_UMASK = 0o077
#: Account names the agent looks up (POSIX portable names, as ``useradd`` takes them).
ACCOUNT_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
#: A job's working directory when its account has no home directory (``/nonexistent``).
NO_HOME_CWD = "/tmp"


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
    """How the agent picks the account of a job (``--jobs-as-agent``, ``--allow-root-jobs``)."""

    node: str
    #: Switch to the submitter's account (only root can).
    switch: bool
    allow_root: bool = False

    @classmethod
    def for_agent(cls, node: str, *, jobs_as_agent: bool = False, allow_root: bool = False) -> AccountPolicy:
        return cls(node, switch=os.geteuid() == 0 and not jobs_as_agent, allow_root=allow_root)

    def describe(self) -> str:
        """One line for the agent's start-up message."""
        if self.switch:
            root = "root jobs allowed" if self.allow_root else "never as root"
            return f"jobs run as their submitters' POSIX accounts ({root})"
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
        if not user:
            if self.allow_root:
                return agent_account()
            raise ApiError(400, "user is required: this agent runs each job as its submitter's POSIX account", "user")
        if not ACCOUNT_NAME_RE.fullmatch(user):
            raise ApiError(400, f"user {user!r} is not a POSIX account name", "user")
        try:
            account = Account.of(pwd.getpwnam(user))
        except KeyError:
            raise ApiError(400, f"no POSIX account {user!r} on node {self.node}", "user") from None
        if account.uid == 0 and not self.allow_root:
            raise ApiError(400, f"account {user!r} is root on node {self.node}; jobs never run as root here", "user")
        return account


def may_access(account: Account, path: str, want: int) -> bool:
    """Whether ``account`` has the ``want`` bits (``os.R_OK | os.W_OK | os.X_OK``) on ``path``, by its mode.

    The agent (root) checks for the job's account before anything runs, so a job is refused with a
    reason instead of failing at its first line. Root may do anything; ACLs are not read.
    """
    if account.uid == 0:
        return True
    try:
        info = os.stat(path)
    except OSError:
        return False
    if info.st_uid == account.uid:
        shift = 6
    elif info.st_gid in account.groups or info.st_gid == account.gid:
        shift = 3
    else:
        shift = 0
    bits = (info.st_mode >> shift) & 0o7
    return bits & want == want


def working_directory(account: Account, cwd: str | None, fallback: str) -> str:
    """The directory the job starts in: ``cwd`` when the account may enter it, else a refusal.

    Without ``cwd``: the account's home, else ``fallback`` (the agent's state dir for an agent
    that runs jobs as itself), else :data:`NO_HOME_CWD`.
    """
    if cwd is None:
        if account.home and os.path.isdir(account.home) and may_access(account, account.home, os.X_OK):
            return account.home
        return fallback if os.path.isdir(fallback) and may_access(account, fallback, os.X_OK) else NO_HOME_CWD
    if not os.path.isdir(cwd):
        raise ApiError(400, f"cwd {cwd} is not a directory on this node", "cwd")
    if not may_access(account, cwd, os.X_OK):
        raise ApiError(400, f"cwd {cwd}: account {account.name} may not enter it", "cwd")
    return cwd


def check_output_path(account: Account, output: str) -> None:
    """An output file the account may write: an existing writable file, or a new one in a writable directory."""
    if os.path.isdir(output):
        raise ApiError(400, f"output {output} is a directory; name a file", "output")
    if os.path.lexists(output):
        info = os.lstat(output)
        if stat.S_ISREG(info.st_mode) and not may_access(account, output, os.W_OK):
            raise ApiError(400, f"output {output}: account {account.name} may not write it", "output")
        return
    parent = os.path.dirname(output) or "/"
    if not os.path.isdir(parent):
        raise ApiError(400, f"output {output}: directory {parent} does not exist on this node", "output")
    if not may_access(account, parent, os.W_OK | os.X_OK):
        raise ApiError(400, f"output {output}: account {account.name} may not create files in {parent}", "output")
