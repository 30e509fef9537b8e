//! The proxy router on a real socket in front of three upstreams of the test's
//! own (`idemgate_testkit::upstreams`: strict, lenient, naive), driven by a raw
//! client that sends the spellings an HTTP library would not (issue 20). Every
//! test asserts what each upstream parsed and ran, not only what the proxy said.

mod bodies;
mod framing;
mod headers;
mod methods;
mod paths;
mod principals;
mod stalls;
mod support;
mod upgrades;
