//! A courier's seq state as ingest's batch script keeps it in the `couriers:seq` hash
//! (`ingest/src/script.lua`). Here, not in ingest, because readers of the last-seen time
//! (dispatch, the viewer gateway) take it from this state: `couriers:seen` is written once per
//! `ingest.seen_every` bucket, so its score may lag by up to that.

/// A courier's seq state as the batch script keeps it in the `seq` hash.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SeqState {
    pub seq: f64,
    /// Phone time of the last accepted point.
    pub phone_ts: f64,
    /// Phone time of the first point since the last seq reset.
    pub epoch_ts: f64,
    /// Server time of the last accepted point.
    pub server_ts: f64,
}

impl SeqState {
    /// First byte of the packed form; the text form of earlier versions starts with a digit.
    /// The courier's `seen` score lies in the `ingest.seen_every` bucket of `server_ts`.
    pub const TAG: u8 = 1;
    /// First byte of the packed form after the courier's `offline` took him out of `live` and
    /// `seen`: his next accepted point writes `seen` whatever its bucket.
    pub const OFFLINE_TAG: u8 = 2;
    pub const PACKED_LEN: usize = 33;

    /// The packed form: the tag (1), then the four fields as little-endian doubles
    /// (`struct.pack('<Bdddd', 1, ...)` in the script).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::PACKED_LEN);
        v.push(Self::TAG);
        for x in [self.seq, self.phone_ts, self.epoch_ts, self.server_ts] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }

    /// How far the phone's clock was behind the server when the last point arrived (seconds;
    /// network delay plus the phone's clock error): the ops map's "phone lag".
    pub fn phone_lag(&self) -> f64 {
        self.server_ts - self.phone_ts
    }

    /// Reads the packed form, or the `seq|phone_ts|epoch_ts|server_ts` text that scripts before
    /// it wrote (the script reads both, so a deployment upgrades without losing state).
    pub fn decode(raw: &[u8]) -> Option<Self> {
        if raw.len() == Self::PACKED_LEN && (raw[0] == Self::TAG || raw[0] == Self::OFFLINE_TAG) {
            let f = |i: usize| f64::from_le_bytes(raw[1 + 8 * i..9 + 8 * i].try_into().unwrap());
            return Some(SeqState {
                seq: f(0),
                phone_ts: f(1),
                epoch_ts: f(2),
                server_ts: f(3),
            });
        }
        let text = std::str::from_utf8(raw).ok()?;
        let mut it = text.split('|').map(|x| x.parse::<f64>().ok());
        let s = SeqState {
            seq: it.next()??,
            phone_ts: it.next()??,
            epoch_ts: it.next()??,
            server_ts: it.next()??,
        };
        it.next().is_none().then_some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_tags_and_the_text_form_are_read() {
        let st = SeqState {
            seq: 42.0,
            phone_ts: 1764460799.25,
            epoch_ts: 1764460000.5,
            server_ts: 1764460800.125,
        };
        let mut packed = st.encode();
        assert_eq!(packed.len(), SeqState::PACKED_LEN);
        assert_eq!(packed[0], SeqState::TAG);
        assert_eq!(SeqState::decode(&packed), Some(st));
        assert_eq!(st.phone_lag(), 0.875);
        packed[0] = SeqState::OFFLINE_TAG;
        assert_eq!(SeqState::decode(&packed), Some(st));
        assert_eq!(
            SeqState::decode(b"42|1764460799.25|1764460000.5|1764460800.125"),
            Some(st)
        );
        packed[0] = 3;
        for bad in [
            &b""[..],
            b"42|1|2",
            b"42|1|2|3|4",
            b"x|1|2|3",
            &packed[..32],
            &packed,
        ] {
            assert_eq!(SeqState::decode(bad), None, "{bad:?}");
        }
    }
}
