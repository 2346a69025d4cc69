"""`sluice data nexmark OUT --events N`: the Nexmark benchmark's three tables (person, auction, bid) as JSON
lines, written by Spark, following the public Nexmark generator's distributions (Beam's and Flink's nexmark:
GeneratorConfig, PersonGenerator, AuctionGenerator, BidGenerator):

- events are numbered 0..N-1; of every 50, 1 is a person, 3 are auctions, 46 are bids, in that order;
- event n happens at BASE_TIME + n * 100 microseconds (10,000 events a second, the generator's default first
  event rate), rounded down to the millisecond: every table is in event-time order;
- person ids and auction ids count from 1000; an auction's seller, a bid's bidder and a bid's auction are the
  'hot' one of the last 100 people or auctions with probability 1 - 1/ratio (hot sellers 4, hot bidders 4, hot
  auctions 2), else one of the 1000 most recent people / 100 auctions in flight plus a lead of 10 ids not yet made;
- prices are round(10 ** (u * 6) * 100) for a uniform u (PriceGenerator); categories 10..14; states, cities and
  names from the generator's lists; a bid's channel is one of the four hot ones (Google, Facebook, Baidu, Apple)
  with probability 1/2, else 'channel-<k>' with k < 10,000 and a url carrying `channel_id=<k>`;
- an auction expires a random time up to twice the span in which the next 100 auctions are made.

The random draws are not Java's Random: each is a hash of (seed, event number, draw) (xxhash64 in Spark SQL, no
Python UDF), so the data set depends only on N and the seed, whatever the Spark master or partitioning. Each table
is one file in event order, so a single reader sees event times in order (no record is late for any watermark).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from runtime.data.spark import DataError

BASE_TIME_MS = 1_436_918_400_000  # 2015-07-15 00:00:00 UTC, Nexmark's base time
PROPORTION = 50
PERSON_PROPORTION, AUCTION_PROPORTION = 1, 3
FIRST_ID = 1000
FIRST_CATEGORY_ID, NUM_CATEGORIES = 10, 5
HOT_AUCTION_RATIO, HOT_BIDDER_RATIO, HOT_SELLER_RATIO = 2, 4, 4
HOT_BATCH = 100
ACTIVE_PEOPLE, IN_FLIGHT_AUCTIONS, ID_LEAD = 1000, 100, 10
CHANNELS = 10_000
STATES = ["AZ", "CA", "ID", "OR", "WA", "WY"]
CITIES = ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
          "Cheyenne"]
FIRST_NAMES = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"]
LAST_NAMES = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"]
HOT_CHANNELS = ["Google", "Facebook", "Baidu", "Apple"]


@dataclass
class NexmarkResult:
    out: str
    events: int
    rows: dict[str, int]
    seconds: float

    def summary(self) -> str:
        counts = ", ".join(f"{t} {n:,}" for t, n in self.rows.items())
        return f"wrote {self.events:,} Nexmark events to {self.out} ({counts}) in {self.seconds:.1f}s"


def check_nexmark_args(out: str, events: int, seed: int) -> None:
    if events < PROPORTION:
        raise DataError(f"--events must be at least {PROPORTION} (one person, three auctions, 46 bids)")
    if os.path.exists(out) and not os.path.isdir(out):
        raise DataError(f"{out} exists and is not a directory")


def _sql_list(values: list[str]) -> str:
    return "array(" + ", ".join(f"'{v}'" for v in values) + ")"


def nexmark_frames(spark: Any, events: int, seed: int) -> dict[str, Any]:
    """The three tables as DataFrames (not yet written)."""
    spark.range(events).createOrReplaceTempView("nexmark_events")

    def u(draw: int) -> str:  # a uniform double in [0, 1) from the hash of (seed, event, draw)
        return f"(shiftrightunsigned(xxhash64({seed}, id, {draw}), 11) / 9007199254740992.0)"

    def below(draw: int, n: Any) -> str:  # a uniform integer in [0, n)
        return f"CAST(FLOOR({u(draw)} * ({n})) AS BIGINT)"

    epoch, offset = f"(id DIV {PROPORTION})", f"(id % {PROPORTION})"
    # the last person / auction made by event `id` (the generator's lastBase0PersonId / lastBase0AuctionId)
    last_person = f"({epoch} * {PERSON_PROPORTION} + IF({offset} >= {PERSON_PROPORTION}, {PERSON_PROPORTION} - 1, " \
                  f"{offset}))"
    last_auction = (f"(IF({offset} < {PERSON_PROPORTION}, {epoch} - 1, {epoch}) * {AUCTION_PROPORTION} + "
                    f"IF({offset} < {PERSON_PROPORTION}, {AUCTION_PROPORTION} - 1, "
                    f"IF({offset} >= {PERSON_PROPORTION + AUCTION_PROPORTION}, {AUCTION_PROPORTION} - 1, "
                    f"{offset} - {PERSON_PROPORTION})))")

    def random_person(draw: int) -> str:  # nextBase0PersonId
        people = f"({last_person} + 1)"
        active = f"LEAST({people}, {ACTIVE_PEOPLE})"
        return f"({people} - {active} + {below(draw, f'{active} + {ID_LEAD}')})"

    def random_auction(draw: int) -> str:  # nextBase0AuctionId
        low = f"GREATEST({last_auction} - {IN_FLIGHT_AUCTIONS}, 0)"
        return f"({low} + {below(draw, f'{last_auction} - {low} + 1 + {ID_LEAD}')})"

    def price(draw: int) -> str:
        return f"CAST(ROUND(POW(10.0, {u(draw)} * 6.0) * 100.0) AS BIGINT)"

    def word(draw: int, length: int) -> str:  # a lowercase string of `length` letters
        return "concat(" + ", ".join(f"char(97 + {below(draw * 100 + i, 26)})" for i in range(length)) + ")"

    stamp = "(BASE + id DIV 10)"
    date_time = f"date_format(timestamp_millis({stamp}), 'yyyy-MM-dd HH:mm:ss.SSS')"
    kinds = f"CASE WHEN {offset} < {PERSON_PROPORTION} THEN 'person' WHEN {offset} < " \
            f"{PERSON_PROPORTION + AUCTION_PROPORTION} THEN 'auction' ELSE 'bid' END"
    base = spark.sql(f"SELECT id, {kinds} AS kind, {BASE_TIME_MS} AS BASE FROM nexmark_events")
    base.createOrReplaceTempView("nexmark_kinds")
    person = spark.sql(f"""
        SELECT {last_person} + {FIRST_ID} AS id,
               concat(element_at({_sql_list(FIRST_NAMES)}, CAST({below(1, len(FIRST_NAMES))} + 1 AS INT)), ' ',
                      element_at({_sql_list(LAST_NAMES)}, CAST({below(2, len(LAST_NAMES))} + 1 AS INT))) AS name,
               concat({word(3, 7)}, '@', {word(4, 5)}, '.com') AS emailAddress,
               concat_ws(' ', lpad(CAST({below(5, 10000)} AS STRING), 4, '0'), lpad(CAST({below(6, 10000)} AS STRING),
                         4, '0'), lpad(CAST({below(7, 10000)} AS STRING), 4, '0'),
                         lpad(CAST({below(8, 10000)} AS STRING), 4, '0')) AS creditCard,
               element_at({_sql_list(CITIES)}, CAST({below(9, len(CITIES))} + 1 AS INT)) AS city,
               element_at({_sql_list(STATES)}, CAST({below(10, len(STATES))} + 1 AS INT)) AS state,
               {date_time} AS dateTime, {word(11, 8)} AS extra
        FROM nexmark_kinds WHERE kind = 'person' ORDER BY id""")
    horizon_events = IN_FLIGHT_AUCTIONS * PROPORTION // AUCTION_PROPORTION  # events until 100 more auctions
    horizon_ms = horizon_events // 10
    auction = spark.sql(f"""
        SELECT {last_auction} + {FIRST_ID} AS id, {word(1, 20)} AS itemName, {word(2, 30)} AS description,
               {price(3)} AS initialBid, {price(3)} + {price(4)} AS reserve, {date_time} AS dateTime,
               date_format(timestamp_millis({stamp} + 1 + {below(5, 2 * horizon_ms)}), 'yyyy-MM-dd HH:mm:ss.SSS')
                 AS expires,
               IF({below(6, HOT_SELLER_RATIO)} > 0, ({last_person} DIV {HOT_BATCH}) * {HOT_BATCH},
                  {random_person(7)}) + {FIRST_ID} AS seller,
               {FIRST_CATEGORY_ID} + {below(8, NUM_CATEGORIES)} AS category, {word(9, 8)} AS extra
        FROM nexmark_kinds WHERE kind = 'auction' ORDER BY id""")
    hot = f"{below(6, 2)} = 0"
    channel_no = below(7, CHANNELS)
    bid = spark.sql(f"""
        SELECT IF({below(1, HOT_AUCTION_RATIO)} > 0, ({last_auction} DIV {HOT_BATCH}) * {HOT_BATCH},
                  {random_auction(2)}) + {FIRST_ID} AS auction,
               IF({below(3, HOT_BIDDER_RATIO)} > 0, ({last_person} DIV {HOT_BATCH}) * {HOT_BATCH} + 1,
                  {random_person(4)}) + {FIRST_ID} AS bidder,
               {price(5)} AS price,
               IF({hot}, element_at({_sql_list(HOT_CHANNELS)}, CAST({below(8, 4)} + 1 AS INT)),
                  concat('channel-', CAST({channel_no} AS STRING))) AS channel,
               concat('https://www.nexmark.com/', {word(9, 5)}, '/', {word(10, 5)}, '/', {word(11, 5)},
                      '/item.htm?query=1', IF({hot}, '', concat('&channel_id=', CAST({channel_no} AS STRING))))
                 AS url,
               {date_time} AS dateTime, {word(12, 8)} AS extra
        FROM nexmark_kinds WHERE kind = 'bid' ORDER BY id""")
    return {"person": person, "auction": auction, "bid": bid}


def generate_nexmark(spark: Any, out: str, *, events: int, seed: int = 0) -> NexmarkResult:
    """Write OUT/person, OUT/auction, OUT/bid (one JSON-lines file each, in event order); replaces them."""
    started = time.monotonic()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    frames = nexmark_frames(spark, events, seed)
    rows = {}
    os.makedirs(out, exist_ok=True)
    for name, frame in frames.items():
        target = os.path.join(out, name)
        shutil.rmtree(target, ignore_errors=True)
        frame.coalesce(1).write.json(target)
        for f in os.listdir(target):  # Spark's checksums and marker: no reader needs them
            if f.startswith((".", "_")):
                os.remove(os.path.join(target, f))
        rows[name] = spark.read.json(target).count()
    return NexmarkResult(out, events, rows, time.monotonic() - started)


def add_nexmark_parser(dsub: Any) -> None:
    """`sluice data nexmark OUT --events N [--seed S]`."""
    p = dsub.add_parser("nexmark", help="write the Nexmark tables person, auction, bid as JSON lines (Spark)")
    p.add_argument("out", metavar="OUT", help="output directory: OUT/person, OUT/auction, OUT/bid (replaced)")
    p.add_argument("--events", type=int, required=True, help="events in all (1 in 50 a person, 3 auctions, 46 bids)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
