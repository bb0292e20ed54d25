//! Transcript tests of the CM state machine.
