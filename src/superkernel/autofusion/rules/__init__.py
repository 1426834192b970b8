"""The planner's rules, one pattern per module (see each module's docstring)."""
