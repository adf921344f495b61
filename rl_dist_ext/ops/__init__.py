"""Pure math used by every adapter: numpy and torch only (a test enforces this)."""
