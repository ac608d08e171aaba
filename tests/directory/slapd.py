"""A real OpenLDAP ``slapd`` of the test's own: a config in a temp dir, a free port, stopped by pid.

Debian's package installs the program and its schemas; its own database and daemon are not used
(``make directory`` installs it with ``slapd/no_configuration``). The directory is
``dc=example,dc=org`` with ``ou=people`` and ``ou=groups`` (``groupOfNames``); the service account
the portal searches with is ``cn=portal,dc=example,dc=org``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.waiting import stop_process, wait_for

SLAPD = shutil.which("slapd") or ("/usr/sbin/slapd" if Path("/usr/sbin/slapd").exists() else None)
SCHEMA_DIR = Path("/etc/ldap/schema")
requires_slapd = pytest.mark.skipif(
    SLAPD is None or not (SCHEMA_DIR / "inetorgperson.schema").exists(),
    reason="needs OpenLDAP's slapd and its schemas (make directory: apt-get install slapd ldap-utils)",
)

BASE = "dc=example,dc=org"
ADMIN_DN = f"cn=admin,{BASE}"
ADMIN_PASSWORD = "admin-secret"
SERVICE_DN = f"cn=portal,{BASE}"
SERVICE_PASSWORD = "portal-secret"

_TLS = """\
TLSCACertificateFile {dir}/cert.pem
TLSCertificateFile {dir}/cert.pem
TLSCertificateKeyFile {dir}/key.pem
"""

_CONFIG = """\
include {schema}/core.schema
include {schema}/cosine.schema
include {schema}/inetorgperson.schema
include {schema}/nis.schema
{tls}pidfile {dir}/slapd.pid
argsfile {dir}/slapd.args
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
maxsize 10485760
suffix "{base}"
rootdn "{admin}"
rootpw {admin_password}
directory {dir}/db
access to attrs=userPassword by anonymous auth by self write by * none
access to * by dn.exact="{service}" read by self read by * none
"""


class Slapd:
    """One slapd: :meth:`start`, :meth:`add_user`/:meth:`add_group`/:meth:`set_members`, :meth:`stop`."""

    def __init__(self, workdir: Path, *, tls: bool = False) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"ldap://127.0.0.1:{self.port}"
        #: With ``tls``: a self-signed certificate for 127.0.0.1 (``ca_file``), StartTLS on ``url``
        #: and LDAPS on ``ldaps_url``.
        self.tls = tls
        self.ldaps_port = free_port() if tls else None
        self.ldaps_url = f"ldaps://127.0.0.1:{self.ldaps_port}" if tls else ""
        self.ca_file = workdir / "cert.pem"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import ldap

        assert SLAPD is not None
        (self.workdir / "db").mkdir(parents=True, exist_ok=True)
        if self.tls:
            self_signed(self.workdir / "key.pem", self.ca_file)
        conf = self.workdir / "slapd.conf"
        conf.write_text(
            _CONFIG.format(
                tls=_TLS.format(dir=self.workdir) if self.tls else "",
                schema=SCHEMA_DIR,
                dir=self.workdir,
                base=BASE,
                admin=ADMIN_DN,
                admin_password=ADMIN_PASSWORD,
                service=SERVICE_DN,
            )
        )
        log = (self.workdir / "slapd.log").open("ab")
        # -d 0: stay in the foreground (so the test owns the process and stops it by pid), log nothing.
        listen = f"{self.url}/" + (f" {self.ldaps_url}/" if self.tls else "")
        argv = [SLAPD, "-f", str(conf), "-h", listen, "-d", "0"]
        self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

        def answers() -> bool:
            assert self._proc is not None
            assert self._proc.poll() is None, (self.workdir / "slapd.log").read_text()[-2000:]
            self.admin().whoami_s()
            return True

        wait_for(answers, ignore=(ldap.SERVER_DOWN,), message=f"slapd on port {self.port} to answer")
        conn = self.admin()
        conn.add_s(BASE, _attrs(objectClass=["dcObject", "organization"], dc="example", o="Example"))
        conn.add_s(f"ou=people,{BASE}", _attrs(objectClass="organizationalUnit", ou="people"))
        conn.add_s(f"ou=groups,{BASE}", _attrs(objectClass="organizationalUnit", ou="groups"))
        conn.add_s(
            SERVICE_DN,
            _attrs(
                objectClass=["organizationalRole", "simpleSecurityObject"], cn="portal", userPassword=SERVICE_PASSWORD
            ),
        )

    def admin(self) -> object:
        import ldap

        conn = ldap.initialize(self.url)
        conn.set_option(ldap.OPT_NETWORK_TIMEOUT, 5)
        conn.simple_bind_s(ADMIN_DN, ADMIN_PASSWORD)
        return conn

    def user_dn(self, uid: str) -> str:
        return f"uid={uid},ou=people,{BASE}"

    def group_dn(self, cn: str) -> str:
        return f"cn={cn},ou=groups,{BASE}"

    def add_user(self, uid: str, password: str, *, given: str = "", surname: str = "", mail: str = "") -> None:
        self.admin().add_s(  # type: ignore[attr-defined]
            self.user_dn(uid),
            _attrs(
                objectClass="inetOrgPerson",
                uid=uid,
                cn=f"{given} {surname}".strip() or uid,
                sn=surname or uid,
                givenName=given or uid,
                mail=mail or f"{uid}@example.org",
                userPassword=password,
            ),
        )

    def delete_user(self, uid: str) -> None:
        self.admin().delete_s(self.user_dn(uid))  # type: ignore[attr-defined]

    def add_group(self, cn: str, members: Iterable[str]) -> None:
        # groupOfNames needs one member at least: an empty group holds the admin entry, as sites do.
        dns = [self.user_dn(m) for m in members] or [ADMIN_DN]
        self.admin().add_s(self.group_dn(cn), _attrs(objectClass="groupOfNames", cn=cn, member=dns))  # type: ignore[attr-defined]

    def set_members(self, cn: str, members: Iterable[str]) -> None:
        import ldap

        dns = [self.user_dn(m) for m in members] or [ADMIN_DN]
        self.admin().modify_s(  # type: ignore[attr-defined]
            self.group_dn(cn), [(ldap.MOD_REPLACE, "member", [dn.encode() for dn in dns])]
        )

    def stop(self) -> None:
        if self._proc is None:
            return
        stop_process(self._proc)
        self._proc = None


def self_signed(key: Path, cert: Path) -> None:
    """A self-signed certificate for 127.0.0.1, valid two days (openssl)."""
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
    argv += ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(argv, check=True, capture_output=True)


def _attrs(**values: str | list[str]) -> list[tuple[str, list[bytes]]]:
    """python-ldap's ``add_s`` list: every value as bytes."""
    out = []
    for key, value in values.items():
        items = value if isinstance(value, list) else [value]
        out.append((key, [v.encode() for v in items]))
    return out
