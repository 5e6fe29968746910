//! Clustering: the connections that let several Clarion processes act as one server.

pub mod nats_link;
