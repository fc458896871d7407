"""Agent sessions under the machine's budget: the wrapper, placing a running session, which
bookings are sessions, and how many fit."""
