//! Shared support for the end-to-end tests.
