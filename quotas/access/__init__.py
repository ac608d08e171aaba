"""Access: API tokens (issuing, revoking, the Tokens page) and sign-in locks with their audit trail.

The API's authentication itself is shared plumbing (:mod:`npuportal.api.authentication`); it reads the
tokens made here.
"""
