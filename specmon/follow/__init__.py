"""Following a running deployment (`specmon watch`): configuration, tailing, polls, notices and Prometheus."""
