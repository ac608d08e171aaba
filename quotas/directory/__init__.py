"""Sign-in with the site's directory (LDAP / Active Directory, OIDC) and teams from its groups.

- :mod:`.groups`: which teams and roles a set of directory groups gives, read off the active policy
  (``teams[].directory`` and ``spec.directory``); pure, no database.
- :mod:`.apply`: puts that on a user (memberships, finance, admin), audited; sign-ins and
  ``manage.py directory sync`` both go through it.
- :mod:`.ldap`: the LDAP settings read from the environment, the sign-in backend, and the sync.
- :mod:`.oidc`: the single sign-on backend.
"""
