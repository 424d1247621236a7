"""The broker's Unix control socket: the listener, one session per connection,
and the refusals at accept."""
