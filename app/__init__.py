"""redrafter-chat: a Textual terminal chat app on redrafter_mlx (see app.py; run `redrafter-chat --help`)."""
