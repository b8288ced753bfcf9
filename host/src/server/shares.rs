//! A bound shared by every client, of which one client address may hold
//! only a part: sockets draining ([`super::linger`]), bytes of answers not
//! yet read ([`super::answers`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

pub struct Shares {
    most: u64,
    most_per_address: u64,
    /// Taken in all, and by address (made at the first take, so that a
    /// `static` can hold one).
    taken: Mutex<(u64, Option<HashMap<IpAddr, u64>>)>,
}

impl Shares {
    pub const fn new(most: u64, most_per_address: u64) -> Shares {
        Shares {
            most,
            most_per_address,
            taken: Mutex::new((0, None)),
        }
    }

    /// The most one address may hold at once.
    pub fn most_per_address(&self) -> u64 {
        self.most_per_address
    }

    /// Take `n` for `address` (`None`: counted only in all, as a trusted
    /// proxy's connection is), if both bounds leave room for it.
    pub fn take(&self, address: Option<IpAddr>, n: u64) -> bool {
        let address = address.map(crate::ids::client_key);
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let (all, by_address) = &mut *taken;
        if *all + n > self.most {
            return false;
        }
        if let Some(ip) = address {
            let of_ip = by_address
                .get_or_insert_with(HashMap::new)
                .entry(ip)
                .or_default();
            if *of_ip + n > self.most_per_address {
                return false;
            }
            *of_ip += n;
        }
        *all += n;
        true
    }

    /// Give back `n` that `address` took.
    pub fn give(&self, address: Option<IpAddr>, n: u64) {
        let address = address.map(crate::ids::client_key);
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let (all, by_address) = &mut *taken;
        *all -= n;
        if let (Some(ip), Some(map)) = (address, by_address.as_mut())
            && let Some(of_ip) = map.get_mut(&ip)
        {
            *of_ip -= n;
            if *of_ip == 0 {
                map.remove(&ip);
            }
        }
    }

    /// What `address` holds now, and how many addresses hold any.
    #[cfg(test)]
    pub fn held(&self, address: IpAddr) -> (u64, usize) {
        let address = crate::ids::client_key(address);
        let taken = self.taken.lock().unwrap();
        let map = taken.1.as_ref();
        (
            map.and_then(|m| m.get(&address)).copied().unwrap_or(0),
            map.map_or(0, HashMap::len),
        )
    }
}
