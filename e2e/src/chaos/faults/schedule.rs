//! The seed's fault schedule, as a pure function: which kind comes at each
//! place, how long before it, and what it chooses (a victim, a node, a
//! mode). Each fault draws from a generator of its own, derived from (seed,
//! index), so nothing a fault does — how many messages the injector finds
//! to copy, how many draws that takes — moves any later choice: a replay of
//! a seed meets the same faults in the same order with the same targets.
//! Only how long the schedule runs (until every kind and crash point has
//! fired) depends on the run.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};

use super::Fault;
use crate::proxy::Mode;
use crate::stack::Service;

/// The schedule of one seed over `kinds`.
#[derive(Debug, Clone)]
pub struct Plan {
    seed: u64,
    kinds: Vec<Fault>,
}

/// What a fault chose from its generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Nothing to choose (a crash point arms every target of its kind).
    Fixed,
    /// The service it acts on (a SIGKILL's victim, the service cut off).
    Service(Service),
    /// The Kafka node it acts on, 1-based.
    Node(u32),
    /// The network's misbehaviour between payment-service and the gateway.
    Network(Mode),
}

/// A generator for `(seed, stream, index)`: splitmix64 over the three, so
/// that neighbouring indexes give unrelated generators.
fn derive(seed: u64, stream: u64, index: u64) -> StdRng {
    let mut x = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    StdRng::seed_from_u64(x ^ (x >> 31))
}

const ROUND: u64 = 1;
const FAULT: u64 = 2;
const PAUSE: u64 = 3;

impl Plan {
    /// The schedule of `seed` over `kinds` (in the order of the first round).
    pub fn new(seed: u64, kinds: Vec<Fault>) -> Self {
        Self { seed, kinds }
    }

    /// The kind at place `index`: the first round in the order given (faults
    /// that need traffic first), every later round shuffled by its own
    /// generator. A kind that has not fired comes again in the next round.
    pub fn kind_at(&self, index: usize) -> Fault {
        let n = self.kinds.len();
        let round = index / n;
        let mut order = self.kinds.clone();
        if round > 0 {
            order.shuffle(&mut derive(self.seed, ROUND, round as u64));
        }
        order[index % n]
    }

    /// The pause before the fault at `index`: `interval` plus up to half of it.
    pub fn pause_before(&self, index: usize, interval: Duration) -> Duration {
        let jitter = derive(self.seed, PAUSE, index as u64).gen_range(0..=interval.as_millis() as u64 / 2);
        interval + Duration::from_millis(jitter)
    }

    /// The fault at `index`'s own generator: its choice is drawn first
    /// ([`choose`]); whatever it draws after (the injector's picks) is its own.
    pub fn rng_for(&self, index: usize) -> StdRng {
        derive(self.seed, FAULT, index as u64)
    }
}

/// What `fault` chooses from `rng` on a cluster of `nodes` Kafka nodes.
pub fn choose(fault: Fault, rng: &mut StdRng, nodes: u32) -> Choice {
    match fault {
        Fault::RandomKill => Choice::Service(
            *[
                Service::OrderApi,
                Service::Relay,
                Service::Inventory,
                Service::Payment,
                Service::Gateway,
            ]
            .choose(rng)
            .expect("non-empty"),
        ),
        Fault::BrokerRestart | Fault::KafkaNodeIsolated => Choice::Node(rng.gen_range(1..=nodes.max(1))),
        Fault::ServiceCutFromBrokers => Choice::Service(
            *[Service::Inventory, Service::Payment, Service::OrderApi]
                .choose(rng)
                .expect("non-empty"),
        ),
        Fault::NetworkFault => Choice::Network(
            *[Mode::Latency(Duration::from_millis(150)), Mode::Reset, Mode::Blackhole]
                .choose(rng)
                .expect("non-empty"),
        ),
        _ => Choice::Fixed,
    }
}

impl Choice {
    /// The words a fault's detail starts with for this choice, so that a
    /// run's timeline can be held against its plan.
    pub fn words(self) -> Option<String> {
        match self {
            Choice::Fixed => None,
            Choice::Service(s) => Some(s.name().to_owned()),
            Choice::Node(n) => Some(format!("kafka node {n}")),
            Choice::Network(m) => Some(format!("{m:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng as _;

    use super::*;

    /// The timeline a run of `seed` would meet over `n` places, with the
    /// injector drawing `injector_draws` times from its fault's generator
    /// (as many as the messages it found: the old schedule's leak).
    fn timeline(seed: u64, n: usize, injector_draws: usize) -> Vec<(Fault, Choice, Duration)> {
        let plan = Plan::new(seed, Fault::kinds(3));
        (0..n)
            .map(|i| {
                let fault = plan.kind_at(i);
                let mut rng = plan.rng_for(i);
                let choice = choose(fault, &mut rng, 3);
                if fault == Fault::DuplicateInjection {
                    for _ in 0..injector_draws {
                        let _: u64 = rng.gen();
                    }
                }
                (fault, choice, plan.pause_before(i, Duration::from_millis(800)))
            })
            .collect()
    }

    #[test]
    fn one_seed_meets_the_same_faults_with_the_same_targets_however_the_injector_draws() {
        let n = 4 * Fault::kinds(3).len();
        let first = timeline(7, n, 3);
        assert_eq!(first, timeline(7, n, 3), "a replay");
        assert_eq!(first, timeline(7, n, 400), "the injector's draws move nothing else");
        assert_ne!(first, timeline(8, n, 3), "another seed, another schedule");
        // Every round holds every kind once; the first in the order given.
        let kinds = Fault::kinds(3);
        assert_eq!(first[..kinds.len()].iter().map(|t| t.0).collect::<Vec<_>>(), kinds);
        for round in first.chunks(kinds.len()) {
            let mut got: Vec<Fault> = round.iter().map(|t| t.0).collect();
            got.sort();
            let mut want = kinds.clone();
            want.sort();
            assert_eq!(got, want);
        }
        // The choices vary over the places (not one constant victim).
        let victims: std::collections::BTreeSet<String> = first
            .iter()
            .filter(|t| t.0 == Fault::RandomKill || t.0 == Fault::ServiceCutFromBrokers)
            .filter_map(|t| t.1.words())
            .collect();
        assert!(victims.len() > 1, "{victims:?}");
        // Each place has a generator of its own, not one they all share.
        let plan = Plan::new(7, Fault::kinds(3));
        let firsts: std::collections::BTreeSet<u64> = (0..8).map(|i| plan.rng_for(i).gen()).collect();
        assert_eq!(firsts.len(), 8);
    }
}
