//! Max-min fair division of a whole number of units by demand (water-filling): a
//! client that wants less than an equal part gets what it wants, and what it leaves
//! is shared by the others the same way.

/// Divides `capacity` among clients wanting `demands` (`None`: unknown, as much as
/// it can get), each given at least `floor` while the capacity lasts. The result is
/// in the order of `demands`; its sum is at most `capacity`, and all of `capacity`
/// when the demands (with their floors) reach it.
pub fn max_min(capacity: u64, demands: &[Option<u64>], floor: u64) -> Vec<u64> {
    let n = demands.len();
    let mut shares = vec![0u64; n];
    if n == 0 {
        return shares;
    }
    let want = |i: usize| demands[i].map_or(u64::MAX, |d| d.max(floor));
    let mut order: Vec<usize> = (0..n).collect();
    // The index in the key makes it a total order: an unstable sort gives the same.
    order.sort_unstable_by_key(|&i| (want(i), i));
    let mut left = capacity;
    for (k, &i) in order.iter().enumerate() {
        let others = (n - k) as u64;
        let equal = left / others;
        let give = want(i).min(equal);
        shares[i] = give;
        left -= give;
    }
    // What the rounding down left goes one unit each to the clients that wanted more,
    // the hungriest first.
    for &i in order.iter().rev() {
        if left == 0 {
            break;
        }
        if shares[i] < want(i) {
            shares[i] += 1;
            left -= 1;
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_demands_are_met_and_the_rest_is_shared_equally() {
        assert_eq!(
            max_min(100, &[Some(10), Some(500), Some(500)], 0),
            [10, 45, 45]
        );
        assert_eq!(
            max_min(100, &[Some(10), Some(20), Some(30)], 0),
            [10, 20, 30]
        );
        assert_eq!(max_min(100, &[None, None, None], 0), [33, 33, 34]);
        assert_eq!(max_min(10, &[Some(0), Some(0), None], 1), [1, 1, 8]);
        assert_eq!(max_min(2, &[None, None, None], 1), [0, 1, 1]);
        assert_eq!(max_min(0, &[None], 1), [0]);
        assert!(max_min(5, &[], 0).is_empty());
    }

    proptest! {
        /// Never more than the capacity; all of it when wanted; nobody above its
        /// demand; and nobody with less than it wants while another has more than it
        /// (plus the one unit of rounding).
        #[test]
        fn the_division_is_max_min_fair(
            capacity in 0u64..10_000,
            demands in proptest::collection::vec(proptest::option::of(0u64..5_000), 0..20),
        ) {
            let shares = max_min(capacity, &demands, 0);
            let total: u64 = shares.iter().sum();
            prop_assert!(total <= capacity);
            let wanted: u128 = demands.iter().map(|d| d.map_or(u64::MAX as u128, u128::from)).sum();
            if wanted >= u128::from(capacity) {
                prop_assert_eq!(total, capacity);
            }
            for (i, s) in shares.iter().enumerate() {
                prop_assert!(demands[i].is_none_or(|d| *s <= d));
                let short = demands[i].is_none_or(|d| *s < d);
                for t in &shares {
                    prop_assert!(!short || *t <= s + 1, "{:?} -> {:?}", demands, shares);
                }
            }
        }
    }
}
