//! Operating the server: the isolation self-test ([`doctor`]), the client side of the
//! container healthcheck ([`health`]) and the benchmark ([`bench`](mod@bench)).

pub mod bench;
pub mod doctor;
pub mod health;
