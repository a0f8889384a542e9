//! Calendar conversions the helper needs without a date library: HTTP dates (Go's
//! `http.TimeFormat`, written for `Last-Modified` by `cache_archiver.go` `setHeaders`, read
//! back by `http.ParseTime` in `cache_extractor.go`), MS-DOS date/time for zip headers, and
//! RFC 3339 for the artifacts statement. All in UTC.
//!
//! Owns: those formats. Must not know: where they are used.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Seconds since the epoch (negative before it).
pub fn unix_seconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_secs() as i64,
        Err(before) => -(before.duration().as_secs() as i64),
    }
}

fn from_unix(seconds: i64) -> SystemTime {
    if seconds >= 0 {
        UNIX_EPOCH + Duration::from_secs(seconds as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs())
    }
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a civil date.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

struct Parts {
    year: i64,
    month: u32,
    day: u32,
    hour: i64,
    minute: i64,
    second: i64,
    weekday: usize,
}

fn parts(time: SystemTime) -> Parts {
    let seconds = unix_seconds(time);
    let days = seconds.div_euclid(86_400);
    let rest = seconds.rem_euclid(86_400);
    let (year, month, day) = civil(days);
    Parts {
        year,
        month,
        day,
        hour: rest / 3600,
        minute: rest % 3600 / 60,
        second: rest % 60,
        weekday: days.rem_euclid(7) as usize,
    }
}

/// `t.UTC().Format(http.TimeFormat)`: `Mon, 02 Jan 2006 15:04:05 GMT`.
pub fn http_date(time: SystemTime) -> String {
    let p = parts(time);
    let weekday = DAYS.get(p.weekday).copied().unwrap_or("Thu");
    let month = MONTHS.get(p.month as usize - 1).copied().unwrap_or("Jan");
    format!(
        "{weekday}, {:02} {month} {:04} {:02}:{:02}:{:02} GMT",
        p.day, p.year, p.hour, p.minute, p.second
    )
}

/// `t.UTC().Format(time.RFC3339)`.
pub fn rfc3339(time: SystemTime) -> String {
    let p = parts(time);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        p.year, p.month, p.day, p.hour, p.minute, p.second
    )
}

/// `http.ParseTime`: RFC 1123 (`Mon, 02 Jan 2006 15:04:05 GMT`), RFC 850
/// (`Monday, 02-Jan-06 15:04:05 GMT`) or asctime (`Mon Jan  2 15:04:05 2006`).
pub fn parse_http_date(text: &str) -> Option<SystemTime> {
    let words: Vec<&str> = text.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    let (day, month, year, clock) = match words.as_slice() {
        [_, day, month, year, clock, "GMT"] => {
            (day.parse().ok()?, *month, year.parse().ok()?, *clock)
        }
        [_, date, clock, "GMT"] => {
            let mut pieces = date.split('-');
            let day = pieces.next()?.parse().ok()?;
            let month = pieces.next()?;
            let year: i64 = pieces.next()?.parse().ok()?;
            let year = if year < 69 {
                2000 + year
            } else if year < 100 {
                1900 + year
            } else {
                year
            };
            (day, month, year, *clock)
        }
        [_, month, day, clock, year] => (day.parse().ok()?, *month, year.parse().ok()?, *clock),
        _ => return None,
    };
    let month = MONTHS.iter().position(|m| *m == month)? as u32 + 1;
    let mut clock = clock.split(':').map(|p| p.parse::<i64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    if !(1..=31).contains(&day)
        || !(0..24).contains(&hour)
        || !(0..60).contains(&minute)
        || !(0..61).contains(&second)
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(from_unix(
        days * 86_400 + hour * 3600 + minute * 60 + second,
    ))
}

/// MS-DOS (date, time) as zip headers store them (2-second resolution, 1980–2107).
pub fn dos_date_time(time: SystemTime) -> (u16, u16) {
    let p = parts(time);
    if p.year < 1980 {
        return ((1 << 5) | 1, 0);
    }
    let date = (((p.year - 1980).min(127) as u16) << 9) | ((p.month as u16) << 5) | p.day as u16;
    let time = ((p.hour as u16) << 11) | ((p.minute as u16) << 5) | ((p.second / 2) as u16);
    (date, time)
}

/// The inverse of [`dos_date_time`] (tests: extraction takes times from the `0x5455` field).
#[cfg(test)]
pub fn from_dos(date: u16, time: u16) -> SystemTime {
    let year = 1980 + i64::from(date >> 9);
    let month = u32::from((date >> 5) & 0xF).clamp(1, 12);
    let day = u32::from(date & 0x1F).max(1);
    let seconds = i64::from(time >> 11) * 3600
        + i64::from((time >> 5) & 0x3F) * 60
        + i64::from(time & 0x1F) * 2;
    from_unix(days_from_civil(year, month, day) * 86_400 + seconds)
}

/// A time from seconds since the epoch (zip extended-timestamp fields).
pub fn from_unix_seconds(seconds: i64) -> SystemTime {
    from_unix(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_round_trip_in_gos_format() {
        let time = from_unix(1_136_214_245); // Mon, 02 Jan 2006 15:04:05 GMT
        assert_eq!(http_date(time), "Mon, 02 Jan 2006 15:04:05 GMT");
        assert_eq!(parse_http_date("Mon, 02 Jan 2006 15:04:05 GMT"), Some(time));
        assert_eq!(
            parse_http_date("Monday, 02-Jan-06 15:04:05 GMT"),
            Some(time)
        );
        assert_eq!(parse_http_date("Mon Jan  2 15:04:05 2006"), Some(time));
        assert_eq!(parse_http_date("yesterday"), None);
        assert_eq!(rfc3339(time), "2006-01-02T15:04:05Z");
    }

    #[test]
    fn dos_times_keep_two_second_resolution() {
        let time = from_unix(1_136_214_245);
        let (date, clock) = dos_date_time(time);
        assert_eq!(from_dos(date, clock), from_unix(1_136_214_244));
    }
}
