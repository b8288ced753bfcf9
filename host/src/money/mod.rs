//! Money: the embedded cash ledger, the 402 payment gate, escrow held
//! per contract and the upstream webcash mode.

pub mod escrow;
pub mod ledger;
pub mod payments;
pub mod upgrade;
pub mod upstream;
pub mod x402;
