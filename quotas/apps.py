from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"
    verbose_name = "Teams, quotas and policy"

    def ready(self) -> None:
        from axes.signals import user_locked_out

        from quotas.access.signin import record_lockout

        user_locked_out.connect(record_lockout, dispatch_uid="quotas.access.signin.record_lockout")

        from django.contrib.auth.signals import user_logged_in

        def join_invited_teams(sender: object, request: object, user: object, **_: object) -> None:
            from quotas.tenancy.members import accept_invitations

            accept_invitations(user)

        from django_auth_ldap.backend import ldap_error

        from quotas.directory.ldap import note_directory_error

        ldap_error.connect(note_directory_error, dispatch_uid="quotas.directory.ldap.note_directory_error")
        user_logged_in.connect(join_invited_teams, dispatch_uid="quotas.tenancy.members.accept_invitations", weak=False)
