//! Holds only tests (see `tests/`).
