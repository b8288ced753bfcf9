//! The contract state machine, as data. Status, `allowed_actions` and every
//! refusal (403 / 409) come from [`TABLE`] and [`PICKUPS`]; nothing else
//! decides what may happen.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Issued,
    Active,
    Delivered,
    Settled,
    Refunded,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Issued => "issued",
            State::Active => "active",
            State::Delivered => "delivered",
            State::Settled => "settled",
            State::Refunded => "refunded",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Buyer,
    Seller,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Accept,
    Deliver,
    Pickup,
    Release,
    Refund,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Accept => "accept",
            Action::Deliver => "deliver",
            Action::Pickup => "pickup",
            Action::Release => "release",
            Action::Refund => "refund",
        }
    }

    /// For messages: "cannot be accepted".
    pub fn participle(self) -> &'static str {
        match self {
            Action::Accept => "accepted",
            Action::Deliver => "delivered",
            Action::Pickup => "picked up",
            Action::Release => "released",
            Action::Refund => "refunded",
        }
    }
}

/// When a row applies beyond its state and role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    Always,
    /// Only once `delivery_deadline` has passed.
    AfterDeadline,
}

/// One row of the transition table.
pub struct Rule {
    pub action: Action,
    pub from: State,
    pub to: State,
    pub who: Role,
    pub when: Condition,
}

const fn rule(action: Action, from: State, to: State, who: Role, when: Condition) -> Rule {
    Rule {
        action,
        from,
        to,
        who,
        when,
    }
}

use Action::*;
use Condition::*;
use Role::*;
use State::*;

/// The transitions of PROTOCOL sections 7 and 10.
pub const TABLE: &[Rule] = &[
    rule(Accept, Issued, Active, Seller, Always),
    rule(Deliver, Active, Delivered, Seller, Always),
    rule(Pickup, Delivered, Settled, Buyer, Always),
    rule(Release, Active, Settled, Buyer, Always),
    rule(Release, Delivered, Settled, Buyer, Always),
    // The seller's release records a shipment (PROTOCOL 10).
    rule(Release, Active, Delivered, Seller, Always),
    rule(Refund, Issued, Refunded, Buyer, Always),
    rule(Refund, Active, Refunded, Seller, Always),
    rule(Refund, Active, Refunded, Buyer, AfterDeadline),
    rule(Refund, Delivered, Refunded, Seller, Always),
];

/// What a pickup collects in a state that it does not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collect {
    /// The buyer's certificate (and the delivered text).
    Certificate,
    /// The seller's payout secret.
    Payout,
    /// The buyer's refund secret.
    RefundSecret,
}

/// Pickups that collect without a transition: (state, role, what).
pub const PICKUPS: &[(State, Role, Collect)] = &[
    (Settled, Buyer, Collect::Certificate),
    (Settled, Seller, Collect::Payout),
    (Refunded, Buyer, Collect::RefundSecret),
];

/// What an action by a role in a state amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A transition to this state.
    Move(State),
    /// A pickup that collects without moving.
    Collect(Collect),
    /// The other party could do it here: 403 forbidden_party.
    OtherParty,
    /// No party can do it here: 409 invalid_transition.
    Invalid,
}

fn applies(rule: &Rule, deadline_passed: bool) -> bool {
    match rule.when {
        Always => true,
        AfterDeadline => deadline_passed,
    }
}

/// Decide `action` by `role` in `state`.
pub fn decide(state: State, action: Action, role: Role, deadline_passed: bool) -> Verdict {
    let rows = || {
        TABLE
            .iter()
            .filter(|r| r.action == action && r.from == state)
    };
    if let Some(r) = rows().find(|r| r.who == role && applies(r, deadline_passed)) {
        return Verdict::Move(r.to);
    }
    if action == Pickup
        && let Some((_, _, c)) = PICKUPS.iter().find(|(s, r, _)| *s == state && *r == role)
    {
        return Verdict::Collect(*c);
    }
    let other_can = rows().any(|r| r.who != role)
        || (action == Pickup && PICKUPS.iter().any(|(s, r, _)| *s == state && *r != role));
    // A row of the caller's own role whose condition has not come true yet
    // (the buyer's refund before the deadline) counts as "not now": 409,
    // unless the other party could act.
    if other_can {
        Verdict::OtherParty
    } else {
        Verdict::Invalid
    }
}

/// Whether `role` may take `action` in `state` once the delivery deadline
/// has passed (the buyer's refund of an active contract), for the message
/// of a refusal before it.
pub fn after_deadline(state: State, action: Action, role: Role) -> bool {
    TABLE
        .iter()
        .any(|r| r.action == action && r.from == state && r.who == role && r.when == AfterDeadline)
}

/// Every action, in the order answers list them.
pub const ACTIONS: [Action; 5] = [Accept, Deliver, Pickup, Release, Refund];

/// Every state, in the order a contract may pass through them.
pub const STATES: [State; 5] = [Issued, Active, Delivered, Settled, Refunded];

/// Whether `role` may take `action` in `state` now (a move, or a pickup
/// that collects).
fn may(state: State, action: Action, role: Role, deadline_passed: bool) -> bool {
    matches!(
        decide(state, action, role, deadline_passed),
        Verdict::Move(_) | Verdict::Collect(_)
    )
}

/// Every action some party could take in `state`.
pub fn allowed_actions(state: State, deadline_passed: bool) -> Vec<&'static str> {
    ACTIONS
        .into_iter()
        .filter(|a| {
            [Buyer, Seller]
                .into_iter()
                .any(|r| may(state, *a, r, deadline_passed))
        })
        .map(Action::name)
        .collect()
}

/// The actions `role` may take in `state` now: who must act next, which
/// [`allowed_actions`] does not say.
pub fn actions_of(state: State, role: Role, deadline_passed: bool) -> Vec<&'static str> {
    ACTIONS
        .into_iter()
        .filter(|a| may(state, *a, role, deadline_passed))
        .map(Action::name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_moves() {
        for r in TABLE {
            assert_eq!(decide(r.from, r.action, r.who, true), Verdict::Move(r.to));
        }
    }

    #[test]
    fn refusals_follow_the_table() {
        assert_eq!(decide(Issued, Accept, Buyer, false), Verdict::OtherParty);
        assert_eq!(decide(Delivered, Accept, Seller, false), Verdict::Invalid);
        assert_eq!(decide(Active, Refund, Buyer, false), Verdict::OtherParty);
        assert_eq!(
            decide(Active, Release, Seller, false),
            Verdict::Move(Delivered)
        );
        assert_eq!(
            decide(Delivered, Release, Seller, false),
            Verdict::OtherParty
        );
        assert_eq!(decide(Settled, Refund, Seller, false), Verdict::Invalid);
        assert_eq!(decide(Issued, Pickup, Buyer, false), Verdict::Invalid);
        assert_eq!(
            decide(Delivered, Pickup, Seller, false),
            Verdict::OtherParty
        );
        assert_eq!(decide(Refunded, Pickup, Seller, false), Verdict::OtherParty);
        assert_eq!(
            decide(Settled, Pickup, Seller, false),
            Verdict::Collect(Collect::Payout)
        );
    }

    #[test]
    fn allowed_actions_per_state() {
        assert_eq!(allowed_actions(Issued, false), ["accept", "refund"]);
        assert_eq!(
            allowed_actions(Active, false),
            ["deliver", "release", "refund"]
        );
        assert_eq!(
            allowed_actions(Delivered, false),
            ["pickup", "release", "refund"]
        );
        assert_eq!(allowed_actions(Settled, false), ["pickup"]);
        assert_eq!(allowed_actions(Refunded, false), ["pickup"]);
    }

    #[test]
    fn actions_per_role_are_the_allowed_ones_split() {
        let of = |s, r, d| actions_of(s, r, d);
        assert_eq!(of(Issued, Seller, false), ["accept"]);
        assert_eq!(of(Issued, Buyer, false), ["refund"]);
        assert_eq!(of(Active, Seller, false), ["deliver", "release", "refund"]);
        assert_eq!(of(Active, Buyer, false), ["release"]);
        assert_eq!(of(Active, Buyer, true), ["release", "refund"]);
        assert_eq!(of(Delivered, Buyer, false), ["pickup", "release"]);
        assert_eq!(of(Delivered, Seller, false), ["refund"]);
        assert_eq!(of(Settled, Buyer, false), ["pickup"]);
        assert_eq!(of(Settled, Seller, false), ["pickup"]);
        assert_eq!(of(Refunded, Buyer, false), ["pickup"]);
        assert!(of(Refunded, Seller, false).is_empty());
        // Together, every allowed action and nothing else.
        for s in [Issued, Active, Delivered, Settled, Refunded] {
            for d in [false, true] {
                let mut both = [of(s, Buyer, d), of(s, Seller, d)].concat();
                both.sort_unstable();
                both.dedup();
                let mut allowed = allowed_actions(s, d);
                allowed.sort_unstable();
                assert_eq!(both, allowed, "{s:?} {d}");
            }
        }
    }
}
