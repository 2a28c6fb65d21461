//! A port's index in its switch and the switch's size: the leaf that ports, switches and the
//! lookup modules share, so that imports flow one way (switch → lookup → here).

/// Index of a port in its switch's table.
pub type PortIndex = u16;

/// Most ports one switch holds.
pub const MAX_PORTS: usize = 2048;
