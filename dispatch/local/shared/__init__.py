"""The shared slice: root's admission engine for a group of users, its install, and a member run's
link to it."""
