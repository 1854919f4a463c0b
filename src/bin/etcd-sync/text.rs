//! Text in and out: duration arguments, the lines `elect --listen` prints, and JSON.

use std::time::Duration;

use etcd_sync::{Holder, LeaderEvent};
use serde::Serialize;

/// Parses a duration like Go's `time.ParseDuration` (`3s`, `500ms`, `1m30s`, `1.5h`;
/// units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), as etcdctl reads its duration flags. A
/// bare number means seconds.
///
/// Not `humantime`: its grammar is another one. It refuses Go's `.5s` and `1.s` and a bare
/// number, and accepts what etcdctl refuses (`5 s`, `1h 30m`, `2min`, `1d`, and `10M` as
/// ten months); the test `humantime_breaks_etcdctl_parity` lists the differences.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return seconds_to_duration(seconds, text);
    }
    let mut rest = text;
    let mut seconds = 0.0_f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 {
            return Err(format!(
                "invalid duration {text:?}: expected a number at {rest:?} (e.g. 3s, 500ms, 1m30s)"
            ));
        }
        let (number, after) = rest.split_at(number_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("invalid duration {text:?}: bad number {number:?}"))?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, remaining) = after.split_at(unit_len);
        let scale = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: missing unit after {number:?} (ns, us, ms, s, m, h)"
                ));
            }
            other => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {other:?} (ns, us, ms, s, m, h)"
                ));
            }
        };
        seconds += value * scale;
        rest = remaining;
    }
    seconds_to_duration(seconds, text)
}

fn seconds_to_duration(seconds: f64, text: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("invalid duration {text:?}"))
}

/// One line of `elect --listen`: `leader <key> <value>` or `no-leader`.
pub fn event_line(event: &LeaderEvent) -> String {
    match event {
        LeaderEvent::Elected(leader) | LeaderEvent::Proclaimed(leader) => {
            format!("leader {} {}", leader.key_str(), leader.value_str())
        }
        LeaderEvent::NoLeader => "no-leader".into(),
    }
}

/// One line of `elect --listen --json`: `{"event":"elected",...}` (fields in the order of
/// [`LeaderJson`]) or `{"event":"no-leader"}`.
pub fn event_json(event: &LeaderEvent) -> serde_json::Result<String> {
    let json = match event {
        LeaderEvent::Elected(leader) => EventJson::Elected(LeaderJson::new(leader)),
        LeaderEvent::Proclaimed(leader) => EventJson::Proclaimed(LeaderJson::new(leader)),
        LeaderEvent::NoLeader => EventJson::NoLeader,
    };
    serde_json::to_string(&json)
}

/// A leadership event as `elect --listen --json` prints it (docs/cli.md):
/// the `event` tag first, then the leader's fields.
#[derive(Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
enum EventJson {
    Elected(LeaderJson),
    Proclaimed(LeaderJson),
    NoLeader,
}

/// The leader's fields, serialized in declaration order (the documented order).
#[derive(Serialize)]
struct LeaderJson {
    key: String,
    value: String,
    revision: i64,
    mod_revision: i64,
    /// The lease in hex, as in the key's name.
    lease: String,
}

impl LeaderJson {
    fn new(leader: &Holder) -> LeaderJson {
        LeaderJson {
            key: leader.key_str().into_owned(),
            value: leader.value_str().into_owned(),
            revision: leader.create_revision,
            mod_revision: leader.mod_revision,
            lease: format!("{:x}", leader.lease),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_sync::KeyMode;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "s", "5x", "-1s", "1.2.3s", "ms5", "5 s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// Why the parser above is hand-written rather than `humantime::parse_duration`: on
    /// these inputs humantime disagrees with etcdctl (Go's `time.ParseDuration`), or with
    /// this tool's bare number of seconds, while the hand parser agrees.
    #[test]
    fn humantime_breaks_etcdctl_parity() {
        let ms = Duration::from_millis;
        let cases: [(&str, Option<Duration>); 11] = [
            // Go accepts, humantime refuses.
            (".5s", Some(ms(500))),
            ("1.s", Some(ms(1000))),
            // Go refuses ("unknown unit" or a space), humantime accepts.
            ("5 s", None),
            ("1h 30m", None),
            ("2min", None),
            ("3sec", None),
            ("1d", None),
            ("1w", None),
            // humantime: 10 months; Go: no such unit (`m` is minutes).
            ("10M", None),
            ("1y", None),
            // Go refuses, humantime too, but this tool reads a bare number as seconds.
            ("7", Some(ms(7000))),
        ];
        for (text, go) in cases {
            assert_eq!(parse_duration(text).ok(), go, "hand parser on {text:?}");
            assert_ne!(
                humantime::parse_duration(text).ok(),
                go,
                "humantime now agrees on {text:?}"
            );
        }
        // Where both agree: etcdctl's usual forms.
        for text in [
            "3s", "500ms", "1m30s", "1.5s", "1h30m", "250us", "250µs", "0", "0s",
        ] {
            assert_eq!(
                parse_duration(text).ok(),
                humantime::parse_duration(text).ok(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn json_lines() {
        let leader = Holder {
            key: b"e/694d".to_vec(),
            value: b"say \"hi\"\n\\\x01".to_vec(),
            create_revision: 7,
            mod_revision: 9,
            lease: 0x694d,
            mode: KeyMode::Exclusive,
            ttl: None,
        };
        assert_eq!(
            event_json(&LeaderEvent::Elected(leader.clone())).unwrap(),
            r#"{"event":"elected","key":"e/694d","value":"say \"hi\"\n\\\u0001","revision":7,"mod_revision":9,"lease":"694d"}"#
        );
        assert!(
            event_json(&LeaderEvent::Proclaimed(leader))
                .unwrap()
                .starts_with(r#"{"event":"proclaimed","#)
        );
        assert_eq!(
            event_json(&LeaderEvent::NoLeader).unwrap(),
            r#"{"event":"no-leader"}"#
        );
        assert_eq!(event_line(&LeaderEvent::NoLeader), "no-leader");
        // serde_json's escapes: the short forms where JSON has one (the hand-written
        // escaping before it wrote `\u0008` and `\u000c`), other controls as `\u00xx`,
        // the rest (DEL, non-ASCII, invalid UTF-8 made U+FFFD) as is.
        let controls = Holder {
            key: b"e/1".to_vec(),
            value: b"\x08\x0c\x1f\x7f\xc3\xa9\xff".to_vec(),
            create_revision: 1,
            mod_revision: 1,
            lease: 1,
            mode: KeyMode::Exclusive,
            ttl: None,
        };
        assert_eq!(
            event_json(&LeaderEvent::Elected(controls)).unwrap(),
            "{\"event\":\"elected\",\"key\":\"e/1\",\"value\":\"\\b\\f\\u001f\x7f\u{e9}\u{fffd}\",\
             \"revision\":1,\"mod_revision\":1,\"lease\":\"1\"}"
        );
    }
}
