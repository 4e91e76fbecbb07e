"""People: users, organizations, teams, projects, memberships and staff roles (issue 13)."""
