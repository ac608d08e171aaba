"""REST API of the quotas app: teams (quota, usage, members), policy versions, API tokens, statements."""
