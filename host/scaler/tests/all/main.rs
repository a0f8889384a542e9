//! The scaler's tests, one binary: the state machine on virtual time (`scaler`) and the async
//! driver's acquire queue and durable seam (`driver`).

mod driver;
mod scaler;
