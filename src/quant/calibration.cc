#include "quant/calibration.h"

#include <algorithm>

#include "core/error.h"

namespace gyre::quant {

const std::string& default_calibration_text() {
  // Written for this project; deliberately mixed so that every kind of input a model sees (prose,
  // dialogue, code, numbers, markup, other scripts) lands in the Hessians.
  static const std::string text =
      R"TEXT(The lighthouse keeper had not spoken to anyone for eleven days when the supply boat finally came around the northern rocks. She watched it from the gallery, one hand on the cold rail, counting the waves between each rise of the bow. The sea was the colour of wet slate, and the gulls kept well away from it.

"You're late," she said when the boatman climbed onto the jetty.
"The weather was late," he answered. "I only followed it."
"Did you bring the lamp oil?"
"Two barrels, flour, coffee, and a letter from your brother. He says the orchard flooded again and the pears are ruined."
"Then we'll have pear wine instead of pears," she said, and for the first time in eleven days she laughed.

Once upon a time, a small brown rabbit named Pip found a shiny key under an old oak tree. Pip did not know what the key could open, so he asked his friend the owl. The owl thought for a long time and said, "Some keys open doors, and some keys open hearts." Pip was confused, but he kept the key anyway, and every night he put it under his pillow.

def moving_average(values, window):
    """Return the simple moving average of a list of numbers."""
    if window <= 0:
        raise ValueError("window must be positive")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out

#include <stdio.h>
int main(void) {
    int counts[26] = {0};
    for (int c; (c = getchar()) != EOF;)
        if (c >= 'a' && c <= 'z') counts[c - 'a']++;
    for (int i = 0; i < 26; i++) printf("%c %d\n", 'a' + i, counts[i]);
    return 0;
}

SELECT customer_id, COUNT(*) AS orders, SUM(total) AS revenue
FROM orders WHERE created_at >= '2024-01-01'
GROUP BY customer_id HAVING COUNT(*) > 3 ORDER BY revenue DESC LIMIT 10;

| city      | population | area (km2) | founded |
|-----------|-----------:|-----------:|--------:|
| Lisbon    |    545,923 |      100.1 |   -1200 |
| Kraków    |    804,237 |      326.8 |     965 |
| Montréal  |  1,762,949 |      431.5 |    1642 |

Photosynthesis converts light energy into chemical energy: carbon dioxide and water, with sunlight absorbed by chlorophyll, become glucose and oxygen (6 CO2 + 6 H2O -> C6H12O6 + 6 O2). The rate depends on temperature, light intensity and the concentration of carbon dioxide, and it falls sharply when any one of them is scarce.

In 1969 the first crewed landing on the Moon took place; the lunar module touched down in the Sea of Tranquility at 20:17 UTC on 20 July. Roughly 650 million people watched the broadcast.

Q: How many minutes are in three and a half hours?
A: Three hours are 180 minutes and half an hour is 30 minutes, so the answer is 210 minutes.

Le marché ouvre tôt le samedi matin. On y trouve du pain encore chaud, des fromages de la région et des fleurs coupées à l'aube. Les vendeurs se connaissent tous et discutent du temps qu'il fera demain.

Der Zug nach München hatte zwanzig Minuten Verspätung, aber niemand auf dem Bahnsteig schien sich darüber zu ärgern. Ein Kind zählte laut die vorbeifahrenden Güterwagen.

El río bajaba crecido después de las lluvias de abril, y los pescadores esperaban en la orilla con paciencia, hablando en voz baja de cosechas, de precios y de sus nietos.

Вечером в деревне становится тихо: только собаки лают вдалеке и скрипит старая калитка.

東京の朝は早い。駅にはもう人があふれていて、誰もが静かに電車を待っている。

我们明天早上八点在图书馆门口见面，然后一起去博物馆。

<html><body><h1>Order confirmed</h1><p>Your package #48213 will arrive on <b>Tuesday</b>.</p></body></html>

{"user": "ada", "roles": ["admin", "editor"], "active": true, "quota_mb": 2048, "last_login": "2024-03-14T09:26:53Z"}

User: Can you explain what a hash table is, briefly?
Assistant: A hash table stores key-value pairs in an array. A hash function turns each key into an index, so looking a key up usually takes constant time. When two keys land on the same index (a collision), the table keeps both, for example in a short list, and compares the keys to find the right one.
User: And when does it get slow?
Assistant: When the table is nearly full or the hash function spreads keys badly, collisions pile up; resizing the array and rehashing the keys restores the speed.
)TEXT";
  return text;
}

std::vector<std::vector<int>> calibration_rows(const Tokenizer& tok, const std::string& text,
                                               int rows, int length, int bos_id) {
  GYRE_CHECK(rows >= 1 && rows <= 4096, "--rows must be between 1 and 4096, got ", rows);
  GYRE_CHECK(length >= 16 && length <= 65536, "--length must be between 16 and 65536, got ",
             length);
  const std::vector<int> ids = tok.encode(text, false);
  GYRE_CHECK(ids.size() >= 16, "the calibration text has only ", ids.size(),
             " tokens; at least 16 are needed");
  const bool bos = bos_id >= 0;
  const int64_t body = length - (bos ? 1 : 0);
  const int64_t total = static_cast<int64_t>(ids.size());
  // Spread the row starts over the text; when it is long enough rows do not overlap.
  const int64_t stride = std::max<int64_t>(1, std::min<int64_t>(body, total / rows));
  std::vector<std::vector<int>> out(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    std::vector<int>& row = out[r];
    row.reserve(static_cast<size_t>(length));
    if (bos) row.push_back(bos_id);
    for (int64_t i = 0; i < body; ++i) row.push_back(ids[(r * stride + i) % total]);
  }
  return out;
}

}  // namespace gyre::quant
