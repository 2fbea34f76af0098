"""The attack suite (issue 41): each case runs an exploit against the real server, guardrail or
builder, and fails when the defence it names is taken away."""
