"""Policy versions: storing and activating them, a team's place in the policy, the dry run, their console pages.

``versions`` keeps the versions (one active, never edited) and the parsed active policy; ``team_policy``
reads and changes one team's weight and quota; ``dryrun`` replays recorded jobs under a candidate;
``views`` and ``forms`` are the console's editor, history and Teams pages.
"""
