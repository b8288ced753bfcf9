//! Money: the embedded cash ledger, the 402 payment gate and escrow held
//! per contract.

pub mod escrow;
pub mod ledger;
pub mod payments;
pub mod upgrade;
pub mod x402;
