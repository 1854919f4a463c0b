//! Text in and out: duration arguments, and the lines `elect --listen` prints.

use std::fmt::Write as _;
use std::time::Duration;

use etcd_sync::{Leader, LeaderEvent};

/// Parses a duration like Go's `time.ParseDuration` (`3s`, `500ms`, `1m30s`, `1.5h`;
/// units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`). A bare number means seconds.
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

/// One line of `elect --listen --json`.
pub fn event_json(event: &LeaderEvent) -> String {
    match event {
        LeaderEvent::Elected(leader) => leader_json("elected", leader),
        LeaderEvent::Proclaimed(leader) => leader_json("proclaimed", leader),
        LeaderEvent::NoLeader => r#"{"event":"no-leader"}"#.into(),
    }
}

fn leader_json(event: &str, leader: &Leader) -> String {
    let mut out = String::with_capacity(128);
    out.push_str(r#"{"event":"#);
    json_string(&mut out, event);
    out.push_str(r#","key":"#);
    json_string(&mut out, &leader.key_str());
    out.push_str(r#","value":"#);
    json_string(&mut out, &leader.value_str());
    let _ = write!(
        out,
        r#","revision":{},"mod_revision":{},"lease":"{:x}"}}"#,
        leader.create_revision, leader.mod_revision, leader.lease
    );
    out
}

/// Appends `text` as a JSON string literal.
pub fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn json_lines() {
        let leader = Leader {
            key: b"e/694d".to_vec(),
            value: b"say \"hi\"\n\\\x01".to_vec(),
            create_revision: 7,
            mod_revision: 9,
            lease: 0x694d,
        };
        assert_eq!(
            event_json(&LeaderEvent::Elected(leader.clone())),
            r#"{"event":"elected","key":"e/694d","value":"say \"hi\"\n\\\u0001","revision":7,"mod_revision":9,"lease":"694d"}"#
        );
        assert!(
            event_json(&LeaderEvent::Proclaimed(leader)).starts_with(r#"{"event":"proclaimed","#)
        );
        assert_eq!(
            event_json(&LeaderEvent::NoLeader),
            r#"{"event":"no-leader"}"#
        );
        assert_eq!(event_line(&LeaderEvent::NoLeader), "no-leader");
    }
}
