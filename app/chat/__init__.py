"""`threadline chat`: a terminal chat, a client of the public HTTP API (nothing else)."""
