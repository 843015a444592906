"""No bad call crashes the process, corrupts memory or writes where it must not."""
